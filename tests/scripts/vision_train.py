"""A user's script in the shape of torchvision's references/classification/train.py, for a
venv with PyPI's torch and torchvision (the Makefile's .venv-vision): an ImageFolder of JPEGs
it writes itself, torchvision's transforms (nn.Modules, called on the training thread inside
next(loader) when -j is 0), a MetricLogger-style generator around the loader, an evaluation
pass over its own loader under no_grad after each epoch, a torchvision model.

    python vision_train.py DATA_DIR [-j WORKERS] [--epochs N] [--model NAME]
"""
import argparse
import os
import random
import time

import torch
import torchvision
from PIL import Image
from torch import nn
from torchvision import transforms


def make_images(root, per_class):
    rng = random.Random(0)
    for split, n in (("train", per_class), ("val", per_class // 3)):
        for c in ("cat", "dog"):
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                colour = tuple(rng.randrange(256) for _ in range(3))
                Image.new("RGB", (96, 80), colour).save(os.path.join(d, f"{i}.jpg"))


def log_every(iterable, header):
    """torchvision's MetricLogger.log_every: a generator that times the loader itself."""
    start = end = time.time()
    data_s = 0.0
    for obj in iterable:
        data_s += time.time() - end
        yield obj
        end = time.time()
    print(f"{header} total {time.time() - start:.2f} s, data {data_s:.2f} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("-j", "--workers", type=int, default=0)
    ap.add_argument("-b", "--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--per-class", type=int, default=24)
    ap.add_argument("--model", default="mobilenet_v3_small")
    args = ap.parse_args()
    make_images(args.data, args.per_class)
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
        transforms.RandomResizedCrop(112), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), normalize]))
    val = torchvision.datasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
        transforms.Resize(128), transforms.CenterCrop(112), transforms.ToTensor(), normalize]))
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, pin_memory=True)
    val_loader = torch.utils.data.DataLoader(val, batch_size=args.batch_size,
                                             num_workers=args.workers, pin_memory=True)
    model = torchvision.models.__dict__[args.model](num_classes=2)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        n = 0
        for image, target in log_every(loader, f"Epoch: [{epoch}]"):
            loss = criterion(model(image), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n += 1
        print(f"epoch {epoch}: {n} steps")
        model.eval()
        with torch.no_grad():
            for image, target in log_every(val_loader, "Test:"):
                criterion(model(image), target)


if __name__ == "__main__":
    main()
