"""A plain training loop whose workers are busy when the loop asks (no monitor import, run
bare or under `monitor run`): 2 persistent workers, 0.4 ms of work a sample (a Python busy
loop, which holds the worker's GIL, or torch matrix products, which release it), batches of
16 of 2 tensors, a small MLP's step on one CPU thread. Prints the time its epochs took.

    python bench/repro/handoff.py [--work python|torch] [--epochs 8] [--sharing file_system]

NOTE [the loop's receive] (monitor/diagnosis/costs.py): 8 epochs on the 2-core box, Python
work, file_descriptor 3.96-4.17 s against file_system 3.51-3.61 s; 2 epochs (about a second)
read no difference.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

A = torch.randn(160, 160)


class Work(Dataset):
    def __init__(self, work: str) -> None:
        self.work = work

    def __len__(self) -> int:
        return 1600

    def __getitem__(self, i: int):
        end = time.perf_counter() + 0.0004
        while time.perf_counter() < end:
            if self.work == "torch":
                A @ A
        return torch.randn(32), i % 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", choices=("python", "torch"), default="python")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sharing", default=None, help="torch's sharing strategy")
    a = ap.parse_args()
    if a.sharing:
        torch.multiprocessing.set_sharing_strategy(a.sharing)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Work(a.work), batch_size=16, num_workers=a.workers,
                        persistent_workers=a.workers > 0)
    start = time.perf_counter()
    for _ in range(a.epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    print(f"took {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
