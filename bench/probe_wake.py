"""What a background thread's wake costs a training loop (NOTE [the writer's wake] in
monitor/probe/watchdog.py): a DataLoader loop (0 workers, a 1 ms spin a step) with no other
thread, then with a thread that wakes every PERIOD seconds and does nothing. For each: the
loop's next() median, the share of steps slower than the bare loop's 90th percentile, and
how late the thread got to run after its timer fired (it needs the GIL from a loop that
releases it for a moment at each torch call and takes it straight back). Figures only.

    python bench/probe_wake.py [--periods 0.5 2] [--steps 6000]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time


def loop(steps: int, period: float | None) -> tuple[list[float], list[float]]:
    from torch.utils.data import DataLoader

    pc = time.perf_counter
    late: list[float] = []
    stop = threading.Event()

    def waker() -> None:
        while True:
            due = pc() + period
            if stop.wait(period):
                return
            late.append(pc() - due)

    if period is not None:
        threading.Thread(target=waker, daemon=True).start()
    loader = DataLoader(list(range(steps)), batch_size=None)
    took = []
    it = iter(loader)
    while True:
        t0 = pc()
        try:
            next(it)
        except StopIteration:
            break
        t1 = pc()
        took.append(t1 - t0)
        end = t1 + 0.001
        while pc() < end:  # the modelled step: a spin
            pass
    stop.set()
    return took, late


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--periods", type=float, nargs="+", default=[0.5, 2.0])
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for r in range(a.rounds):
        bare, _ = loop(a.steps, None)
        p90 = statistics.quantiles(bare, n=10)[-1]
        print(f"round {r}: no thread: next() median {1e6 * statistics.median(bare):.1f} µs")
        for period in a.periods:
            took, late = loop(a.steps, period)
            slow = sum(1 for x in took if x > p90) / len(took)
            lat = ", ".join(f"{1e3 * x:.0f}" for x in late)
            print(f"  a thread waking every {period:g} s: next() median "
                  f"{1e6 * statistics.median(took):.1f} µs, {slow:.0%} of steps slower than "
                  f"the bare loop's p90 ({1e6 * p90:.1f} µs); it ran late by [{lat}] ms")


if __name__ == "__main__":
    main()
