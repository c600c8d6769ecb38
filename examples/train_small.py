"""A real small training loop to try the monitor on: a CNN learns to tell circles from squares
in generated 32x32 images, with per-sample augmentation done in the DataLoader.

    python examples/train_small.py --epochs 3                      # bare
    python -m monitor run -- python examples/train_small.py        # attached, live in the page

Nothing is downloaded: the images are drawn per sample (that drawing plus the augmentation is
the loader's CPU work, so num_workers matters).
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Shapes(Dataset):
    """Circle (label 0) or square (label 1) of random size and place, then augmented."""

    def __init__(self, n: int = 4096, size: int = 32, work: int = 6) -> None:
        self.n, self.size, self.work = n, size, work
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        self.yy, self.xx = yy.float(), xx.float()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        label = i % 2
        r = 4 + 8 * torch.rand((), generator=g)
        cy, cx = (self.size * (0.25 + 0.5 * torch.rand(2, generator=g))).tolist()
        if label == 0:
            img = ((self.yy - cy) ** 2 + (self.xx - cx) ** 2 <= r ** 2).float()
        else:
            img = (((self.yy - cy).abs() <= r) & ((self.xx - cx).abs() <= r)).float()
        x = img.expand(3, -1, -1).clone()
        kernel = torch.full((3, 1, 3, 3), 1 / 9)
        for _ in range(self.work):  # augmentation: jitter, blur, flip, noise
            x = x * (0.8 + 0.4 * torch.rand(3, 1, 1, generator=g))
            x = F.conv2d(x.unsqueeze(0), kernel, padding=1, groups=3).squeeze(0)
            if torch.rand((), generator=g) < 0.5:
                x = x.flip(-1)
            x = x + 0.05 * torch.randn(x.shape, generator=g)
        return (x - x.mean()) / (x.std() + 1e-6), label


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 2),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--lr", type=float, default=2e-3)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    net = model().to(device)
    opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    loader = DataLoader(Shapes(a.samples), batch_size=a.batch_size, shuffle=True,
                        num_workers=a.num_workers, pin_memory=device == "cuda")
    for epoch in range(a.epochs):
        t0, total, correct, loss_sum = time.perf_counter(), 0, 0, 0.0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            out = net(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            total += len(y)
            correct += int((out.argmax(1) == y).sum())
            loss_sum += loss.item() * len(y)
        dt = time.perf_counter() - t0
        print(f"epoch {epoch}: loss {loss_sum / total:.3f}, accuracy {correct / total:.1%}, "
              f"{total / dt:,.0f} samples/s (num_workers={loader.num_workers})", flush=True)
    return 0 if math.isfinite(loss_sum) else 1


if __name__ == "__main__":
    raise SystemExit(main())
