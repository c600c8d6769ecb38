"""Where the attach probe's cost goes in a loop with a real step (issue 33's 1 ms loop): the
time inside the probe's TimedIterator.__next__ and inside the DataLoader's own __next__ per
step, for a step of STEP_MS spun between batches. Figures only.

    python bench/probe_cold.py STEP_MS        # e.g. 0, then 1.0
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    os.environ.setdefault("STARVATION_MONITOR_DB", tempfile.mkdtemp() + "/e.db")
    from monitor.probe import patch, timing

    patch.install()
    import torch.utils.data.dataloader as dl
    from torch.utils.data import DataLoader

    acc = {"outer": 0.0, "inner": 0.0, "n": 0}
    pc = time.perf_counter
    orig_outer, orig_inner = timing.TimedIterator.__next__, dl._BaseDataLoaderIter.__next__

    def outer(self):
        t = pc()
        try:
            return orig_outer(self)
        finally:
            acc["outer"] += pc() - t
            acc["n"] += 1

    def inner(self):
        t = pc()
        try:
            return orig_inner(self)
        finally:
            acc["inner"] += pc() - t

    timing.TimedIterator.__next__ = outer
    dl._BaseDataLoaderIter.__next__ = inner
    loader = DataLoader(list(range(1500)), batch_size=None)
    step = float(sys.argv[1]) / 1000
    t0 = pc()
    for _ in range(4):
        for _ in loader:
            end = pc() + step
            while pc() < end:  # the modelled step: a spin
                pass
    n = acc["n"]
    print(f"step {sys.argv[1]} ms: per step {1e6 * (pc() - t0) / n:.1f} µs wall, "
          f"{1e6 * acc['outer'] / n:.2f} µs in the probe's TimedIterator.__next__, "
          f"{1e6 * acc['inner'] / n:.2f} µs of them in the DataLoader's own __next__")


if __name__ == "__main__":
    main()
