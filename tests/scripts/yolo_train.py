"""Ultralytics' own trainer on a detection dataset this script writes (1-3 boxes an image),
for a venv with PyPI's torch, torchvision and ultralytics (the Makefile's .venv-vision).
Offline: a model built from its yaml, no weights, no plots, YOLO_OFFLINE=1.

    python yolo_train.py DIR [--epochs N] [--workers N] [--images N]

With --workers above 0 the trainer keeps them (Ultralytics sets 0 on a CPU; a GPU run keeps
the user's): its InfiniteDataLoader keeps one iterator, and its workers, for every epoch.
`--dataset-only` writes the dataset and prints its data.yaml, for `yolo train data=...`."""
import argparse
import os
import random


def make_dataset(root, images):
    from PIL import Image
    rng = random.Random(1)
    for split, n in (("train", images), ("val", max(images // 4, 2))):
        os.makedirs(f"{root}/images/{split}", exist_ok=True)
        os.makedirs(f"{root}/labels/{split}", exist_ok=True)
        for i in range(n):
            colour = tuple(rng.randrange(256) for _ in range(3))
            Image.new("RGB", (96, 96), colour).save(f"{root}/images/{split}/{i}.jpg")
            with open(f"{root}/labels/{split}/{i}.txt", "w") as f:
                for _ in range(1 + i % 3):
                    f.write(f"{rng.randrange(2)} {rng.uniform(.3, .7):.3f} "
                            f"{rng.uniform(.3, .7):.3f} {rng.uniform(.1, .3):.3f} "
                            f"{rng.uniform(.1, .3):.3f}\n")
    with open(f"{root}/data.yaml", "w") as f:
        f.write(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: a\n  1: b\n")
    return f"{root}/data.yaml"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--dataset-only", action="store_true")
    args = ap.parse_args()
    data = make_dataset(args.dir, args.images)
    opts = dict(model="yolov8n.yaml", data=data, epochs=args.epochs, imgsz=64, batch=8,
                device="cpu", plots=False, project=f"{args.dir}/runs", name="train",
                exist_ok=True)
    if args.dataset_only:
        print(data)
        return
    from ultralytics.models.yolo.detect import DetectionTrainer

    class Trainer(DetectionTrainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.args.workers = args.workers

    Trainer(overrides=opts).train()


if __name__ == "__main__":
    main()
