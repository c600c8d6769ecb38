"""What the probe costs the training loop: `watch()` over a trivial loader vs the bare loop,
interleaved rounds of equal length, per step amortised (flushes included).

    python bench/probe_cost.py [--steps 20000] [--rounds 5]

Prints each round's µs per step, bare and watched, and the median difference. Figures only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Trivial:
    """A loader that yields at once: what is measured is the probe alone."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.num_workers, self.batch_size, self.pin_memory = 0, 1, False

    def __iter__(self):
        return iter(range(self.n))


def loop(it) -> float:
    t = time.perf_counter()
    for _ in it:
        pass
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.environ["STARVATION_MONITOR_DB"] = str(Path(tempfile.mkdtemp()) / "probe.db")
    from monitor import watch

    bare, watched = [], []
    for _ in range(a.rounds):
        bare.append(loop(Trivial(a.steps)) / a.steps * 1e6)
        watched.append(loop(watch(Trivial(a.steps))) / a.steps * 1e6)
    for i, (b, w) in enumerate(zip(bare, watched, strict=True)):
        print(f"round {i}: bare {b:.2f} µs/step, watched {w:.2f} µs/step")
    diff = statistics.median(w - b for b, w in zip(bare, watched, strict=True))
    print(f"probe cost: {diff:.2f} µs per step (median of {a.rounds} interleaved rounds, "
          f"{a.steps} steps each, flushes included)")


if __name__ == "__main__":
    main()
