"""What one pass of the host sampler costs (monitor/sampling/host.py HostSampler.sample_all):
its thread's CPU a pass, following this process and the 4 workers of a DataLoader it
iterates between passes (a rank of a job, as `monitor run` samples it 4 times a second).

    python bench/sampler_pass.py [--workers 4] [--passes 60] [--persistent | --no-persistent]

Figures only: the median and the mean CPU a pass (the mean holds the passes that also scan
the process tree, the workers' USS, the monitor's own processes), and what that is in % of
a core at the sampler's 4 passes a second. The box is shared: compare commits head to head.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from monitor.sampling.host import HostSampler  # noqa: E402

PASSES_A_SECOND = 4


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.001)  # sleep-ok: the workload's modelled loading
        return torch.zeros(4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--persistent", action=argparse.BooleanOptionalAction, default=True)
    a = ap.parse_args()
    it = iter(DataLoader(Sleepy(), batch_size=8, num_workers=a.workers,
                         persistent_workers=a.persistent and a.workers > 0))
    next(it)
    sampler = HostSampler()
    sampler.follow(os.getpid(), 1)
    for _ in range(3):  # its baselines
        sampler.sample_all()
        next(it)
    took = []
    for _ in range(a.passes):
        c = time.thread_time()
        sampler.sample_all()
        took.append(time.thread_time() - c)
        next(it)
    mean = statistics.mean(took)
    print(f"sampler pass, 1 process and {a.workers} workers: median "
          f"{statistics.median(took) * 1e3:.2f} ms, mean {mean * 1e3:.2f} ms of CPU "
          f"({mean * PASSES_A_SECOND * 100:.2f}% of a core at {PASSES_A_SECOND} passes a "
          "second)")


if __name__ == "__main__":
    main()
