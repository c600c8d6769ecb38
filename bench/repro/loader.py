"""A plain training loop for bench/predictions.py: no monitor import, run bare or under
`monitor run`. Its loader is one of three kinds of what real jobs starve from:

- cpu: each sample is a Python loop of --work steps (9,000: ~0.8 ms of one core here)
- storage: each sample waits --latency-ms (a read that blocks: no CPU) and does a little work
- per-sample: tiny samples in big batches (the per-sample cost of the loader itself)

The step holds a simulated device for --step-ms (a sleep, as a synchronize would). It runs for
--seconds and prints one JSON line: samples/s over the steps after the first --warmup
seconds, the steps, and the main process's CPU seconds per step (getrusage, children not
counted).

    python bench/repro/loader.py --kind cpu --workers 2 --seconds 8
"""
from __future__ import annotations

import argparse
import json
import resource
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, kind: str, work: int, latency_s: float) -> None:
        self.kind, self.work, self.latency_s = kind, work, latency_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        if self.kind == "storage":
            time.sleep(self.latency_s)
            n = self.work // 20
        elif self.kind == "per-sample":
            return i
        else:
            n = self.work
        x = 0
        for k in range(n):
            x += k * k
        return torch.full((8,), float(x % 7))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("cpu", "storage", "per-sample"), default="cpu")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=0, help="default: 16 (per-sample: 512)")
    ap.add_argument("--work", type=int, default=9_000)
    ap.add_argument("--latency-ms", type=float, default=3.0)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    a = ap.parse_args()
    batch = a.batch or (512 if a.kind == "per-sample" else 16)
    loader = DataLoader(Samples(a.kind, a.work, a.latency_ms / 1000), batch_size=batch,
                        num_workers=a.workers, shuffle=False)
    t0 = time.perf_counter()
    end = t0 + a.warmup + a.seconds
    samples = steps = 0
    t_from = cpu_from = None
    for b in loader:
        time.sleep(a.step_ms / 1000)  # the simulated device
        now = time.perf_counter()
        if t_from is None and now - t0 >= a.warmup:
            t_from, cpu_from = now, resource.getrusage(resource.RUSAGE_SELF)
        elif t_from is not None:
            samples += len(b)
            steps += 1
        if now >= end:
            break
    ru = resource.getrusage(resource.RUSAGE_SELF)
    took = time.perf_counter() - t_from
    cpu = (ru.ru_utime + ru.ru_stime) - (cpu_from.ru_utime + cpu_from.ru_stime)
    print(json.dumps({"kind": a.kind, "workers": a.workers, "batch": batch,
                      "throughput": samples / took, "steps": steps, "seconds": took,
                      "main_cpu_per_step_s": cpu / max(1, steps)}))


if __name__ == "__main__":
    main()
