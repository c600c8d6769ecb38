"""torch.compile recompiling on changing shapes (no monitor imports): a small model compiled
with dynamic=False (a common choice for speed), fed batches padded to their longest
sequence, with a short last batch each epoch: dynamo compiles again for each new shape until
its recompile_limit (8). `--buckets`: every batch padded to one length and drop_last=True
(one shape: the fix). `--backend eager` (default: dynamo traces, guards and recompiles as
with inductor, without inductor's code generation, which takes minutes here) or inductor.

    python recompiles.py [--epochs N] [--buckets] [--backend B] [--workers N]

Prints its own samples/s (`rate N samples/s`), and without its first step, which compiles
in either variant (`after the first step N samples/s`)."""
from __future__ import annotations

import argparse
import random
import time

import torch
from torch.utils.data import DataLoader, Dataset

LONGEST = 48


class Sequences(Dataset):
    def __init__(self, n: int) -> None:
        rng = random.Random(0)
        self.lengths = [rng.randrange(4, LONGEST) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.0005)  # sleep-ok: the sample's reading
        return torch.randint(1, 1000, (self.lengths[i],))


def pad(to: int | None):
    def collate(batch: list[torch.Tensor]) -> torch.Tensor:
        n = to or max(len(x) for x in batch)
        out = torch.zeros(len(batch), n, dtype=torch.long)
        for i, x in enumerate(batch):
            out[i, :len(x)] = x
        return out
    return collate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--buckets", action="store_true")
    ap.add_argument("--backend", default="eager")
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 2))
    forward = torch.compile(model, backend=a.backend, dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Sequences(100), batch_size=8, shuffle=True, num_workers=a.workers,
                        collate_fn=pad(LONGEST if a.buckets else None), drop_last=a.buckets)
    samples, t0, after = 0, time.perf_counter(), None
    for _ in range(a.epochs):
        for x in loader:
            loss = forward(x).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            samples += len(x)
            if after is None:  # the first step compiles in either variant: left out below
                after, first = time.perf_counter(), samples
    end = time.perf_counter()
    print(f"after the first step {(samples - first) / (end - after):.1f} samples/s")
    print(f"rate {samples / (end - t0):.1f} samples/s")


if __name__ == "__main__":
    main()
