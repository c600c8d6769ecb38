"""One process's loop for bench/probe_cost.py: a DataLoader over a dataset that costs
nothing, iterated for some epochs bare, under the attach probe (installed as `monitor run`
installs it) or through `watch()`, each epoch timed; prints `us_per_step A B C ...`.

    python bench/probe_loop.py {bare,probed,watch} WORKERS STEPS EPOCHS [STEP_MS] [model]

STEP_MS > 0 spins that long a step (a modelled device step: the 1 ms loop), and prints
`gap_us MEDIAN/MEAN ...` too: per epoch, the µs between one step's spin and the next's (the
DataLoader's next() and the probe's own code: what the probe adds, without the spin's noise);
`model`: each
step is a tiny model's forward, backward and optimizer step (what the phase hooks meet;
STARVATION_MONITOR_PHASES=0 turns them off). Figures only.
"""
from __future__ import annotations

import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Ints:
    """Map-style, its items plain ints: the DataLoader's own path and nothing else."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def main() -> None:
    mode, workers, steps, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4])
    step_s = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
    with_model = len(sys.argv) > 6 and sys.argv[6] == "model"
    os.environ.setdefault("STARVATION_MONITOR_DB", str(Path(tempfile.mkdtemp()) / "p.db"))
    from torch.utils.data import DataLoader

    if mode == "probed":
        from monitor.probe import patch

        patch.install()
    loader = DataLoader(Ints(steps), batch_size=None, num_workers=workers,
                        persistent_workers=workers > 0)
    if mode == "watch":
        from monitor import watch

        def epoch_iter():
            return watch(loader)
    else:
        def epoch_iter():
            return loader
    import torch

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.ones(2, 4)
    out, gaps, medians = [], [], []
    t_spun = None
    for _ in range(epochs):
        t = time.perf_counter()
        gap, tops = [], []
        for _ in epoch_iter():
            tops.append(time.perf_counter())
            if t_spun is not None:  # the loop's own time between two steps: next(), probe
                gap.append(time.perf_counter() - t_spun)
            if with_model:
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
            if step_s:
                end = time.perf_counter() + step_s
                while time.perf_counter() < end:  # the modelled step: a spin, not a sleep
                    pass
                t_spun = time.perf_counter()
        t_spun = None
        out.append((time.perf_counter() - t) / steps * 1e6)
        gaps.append(gap)
        medians.append(statistics.median(b - a for a, b in itertools.pairwise(tops)) * 1e6)
    print("us_per_step " + " ".join(f"{x:.3f}" for x in out), flush=True)
    # per epoch, the median step (one iteration's top to the next's): robust to the box's
    # stalls, which land on a few steps and move the mean
    print("median_step_us " + " ".join(f"{x:.3f}" for x in medians), flush=True)
    if step_s:  # per epoch: the median and the mean µs between a step's end and the next's
        print("gap_us " + " ".join(f"{statistics.median(g) * 1e6:.3f}/"
                                   f"{statistics.fmean(g) * 1e6:.3f}" for g in gaps), flush=True)


if __name__ == "__main__":
    main()
