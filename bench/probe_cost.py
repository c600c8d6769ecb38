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
    print(f"device clock (CUDA events, our side only: a no-op event): "
          f"{device_clock_us(a.steps):.2f} µs per step for its two records and the harvest "
          "(the driver's own cudaEventRecord, ~2.5 µs each, is on top: bench/gpu_check.py)")


class _NoopEvent:
    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: object) -> float:
        return 1.0


class _NoopCuda:
    def is_initialized(self) -> bool:
        return True

    def Event(self, enable_timing: bool = False) -> _NoopEvent:  # torch's name
        return _NoopEvent()


def device_clock_us(steps: int) -> float:
    """Per step: batch_arrived + batch_done + harvest, on events that cost nothing."""
    from monitor.probe.device_clock import DeviceClock

    clock = DeviceClock(_NoopCuda())
    t = time.perf_counter()
    for i in range(steps):
        clock.batch_arrived(i)
        clock.batch_done()
        clock.harvest()
    return (time.perf_counter() - t) / steps * 1e6


if __name__ == "__main__":
    main()
