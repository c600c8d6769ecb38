"""A user's script whose loader does CPU work per sample (augmentation-like tensor ops, about
2 ms) beside a small model on one thread: like examples/train_small.py, but with epochs of a
second, so a test can run a grid of fresh runs and a live autotune in about a minute.
Prints each epoch's samples/s, as a user's own log would."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __len__(self):
        return ARGS.samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 32, 32, generator=g)
        for _ in range(ARGS.work):  # jitter, blur, noise: the loader's CPU cost
            x = x * (0.8 + 0.4 * torch.rand(3, 1, 1, generator=g))
            x = torch.nn.functional.avg_pool2d(x.unsqueeze(0), 3, 1, 1).squeeze(0)
            x = x + 0.05 * torch.randn(x.shape, generator=g)
        return x.flatten()[:64], i % 2


ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=6)
ap.add_argument("--samples", type=int, default=480)
ap.add_argument("--work", type=int, default=12)
ap.add_argument("--num-workers", type=int, default=0)
ap.add_argument("--step-ms", type=float, default=0.0, help="modelled device time per step")
ARGS = ap.parse_args()

if __name__ == "__main__":
    torch.set_num_threads(1)
    model, loss = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2)), \
        nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Augmented(), batch_size=16, num_workers=ARGS.num_workers)
    for epoch in range(ARGS.epochs):
        t, n = time.perf_counter(), 0
        for x, y in loader:
            opt.zero_grad()
            loss(model(x), y).backward()
            opt.step()
            if ARGS.step_ms:
                time.sleep(ARGS.step_ms / 1000)  # sleep-ok: the modelled device step
            n += len(x)
        print(f"epoch {epoch}: {n / (time.perf_counter() - t):.1f} samples/s "
              f"(num_workers={loader.num_workers})", flush=True)
