"""An unmodified asynchronous training loop on CUDA, for bench/gpu_check.py: no per-step
synchronize, no `.item()` each step (a loss is read every 100 steps, as a logger would), so
the host runs ahead of the device and only CUDA events see the device's own idle time.

    python bench/async_train.py --num-workers 0 --seconds 40 [--syncs 3]

Each sample costs --decode-ms of CPU (a decode and augmentation); the model is a small conv
net at batch size 64, so at num_workers=0 the GPU waits for the loader and at 4 it is fed.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    def __init__(self, n: int, decode_ms: float) -> None:
        self.n, self.decode_s = n, decode_ms / 1000.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        end = time.perf_counter() + self.decode_s
        x = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(i))
        while time.perf_counter() < end:  # CPU work, not a sleep: a decode
            x = x * 0.999 + 0.001
        return x, i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--decode-ms", type=float, default=1.0)
    ap.add_argument("--syncs", type=int, default=0,
                    help="host syncs a step: a metric read with .item() between the passes "
                         "(the host waits for the device each time), as a script that logs "
                         "every step does")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device("cuda")
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Decoded(100_000, a.decode_ms), batch_size=64, shuffle=True,
                        num_workers=a.num_workers, pin_memory=True,
                        persistent_workers=a.num_workers > 0)
    end = time.monotonic() + a.seconds
    step = 0
    while time.monotonic() < end:
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            out = model(x)
            for _ in range(a.syncs):  # e.g. accuracy.item() each step: the host waits
                (out.argmax(1) == y).float().mean().item()
                out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if time.monotonic() >= end:
                break


if __name__ == "__main__":
    main()
