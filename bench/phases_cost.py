"""What the step phases (monitor/probe/phases.py) cost a training step, in one process:
the same model step (forward of a root module, backward, a torch optimizer's step) timed in
interleaved rounds with the phase hooks installed and removed, so that the rounds share the
process's caches, allocator and clock, and the box's noise falls on both alike.

    python bench/phases_cost.py [--rounds 61] [--steps 500] [--width 16]

Each round is `--steps` steps; a phases-on round also calls `take()` once a step, as the
probe's record does. Rounds go off, on, off again: the on-off pairs' median difference is the
cost, and the off-off pairs' the noise floor it is read against (on this 2-core box a step of
~190 µs drifts by several µs between rounds of 2,000 steps, so many short rounds, not a few
long ones). Goal (issue 34): phases on within 2 µs of off. Figures only.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from monitor.probe.phases import DISCOVER_STEPS, Phases


def rounds(n_rounds: int, steps: int, width: int
           ) -> tuple[list[float], list[float], list[float]]:
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, width)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    def timed(ph: Phases | None) -> float:
        t = time.perf_counter()
        if ph is None:
            for _ in range(steps):
                step()
        else:
            take = ph.take
            for _ in range(steps):
                step()
                take()
        return (time.perf_counter() - t) / steps * 1e6

    for _ in range(200):
        step()  # warm
    off, on, off2 = [], [], []
    for _ in range(n_rounds):
        off.append(timed(None))
        ph = Phases(lambda why: sys.exit(f"phases failed: {why}"))
        assert ph.install()
        for _ in range(DISCOVER_STEPS):  # discovery: the roots get their class's wrapper
            step()
            ph.take()
        on.append(timed(ph))
        ph.remove()
        off2.append(timed(None))
    return off, on, off2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=61)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--width", type=int, default=16)
    a = ap.parse_args()
    off, on, off2 = rounds(a.rounds, a.steps, a.width)
    cost = [n - (f + g) / 2 for f, n, g in zip(off, on, off2, strict=True)]
    noise = [g - f for f, g in zip(off, off2, strict=True)]
    q = statistics.quantiles(cost, n=4)
    print(f"step bare {statistics.median(off):.2f} µs (median of {a.rounds} rounds of "
          f"{a.steps} steps)")
    print(f"phases on: {statistics.median(cost):+.2f} µs/step (median of the rounds' "
          f"differences from the off rounds beside them; quartiles {q[0]:+.2f} to {q[2]:+.2f})")
    print(f"noise floor, off against off: {statistics.median(noise):+.2f} µs/step (quartiles "
          f"{statistics.quantiles(noise, n=4)[0]:+.2f} to "
          f"{statistics.quantiles(noise, n=4)[2]:+.2f})")

if __name__ == "__main__":
    main()
