"""What the step phases (monitor/probe/phases.py) cost a training step, in one process:
the same model step (forward of a root module, backward, a torch optimizer's step) timed in
interleaved rounds with the phase hooks installed and removed, so that the rounds share the
process's caches, allocator and clock, and the box's noise falls on both alike.

    python bench/phases_cost.py [--rounds 61] [--steps 500] [--width 16]

Each round is `--steps` steps; a phases-on round also calls `take()` once a step, as the
probe's record does. Rounds go off, on, off again: the on-off pairs' median difference is the
cost, and the off-off pairs' the noise floor it is read against (on this 2-core box a step of
~190 µs drifts by several µs between rounds of 2,000 steps, so many short rounds, not a few
long ones). Then each hook's own cost a call, warm (timeit's best of 7: the root's class
wrapper, the backward wrapper, the optimizer's two step hooks with torch's dispatch of them,
`take()`), and their sum: what a step pays where the box is too noisy to resolve it whole.
Goal (issue 34): phases on within 2 µs of off. Figures only.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from monitor.probe import phases as phases_mod
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


def per_call() -> dict[str, float]:
    """Each hook's own µs a call, warm, against the same call without it."""
    def best(f, n: int = 100_000) -> float:
        return min(timeit.repeat(f, number=n, repeat=7)) / n * 1e6

    ph = Phases(lambda why: sys.exit(f"phases failed: {why}"))
    phases_mod._compiling = torch.compiler.is_compiling  # as install() sets it

    def noop(*args, **kwargs):
        return None

    class Root(torch.nn.Module):
        def forward(self, x):
            return x

    root, x = Root(), torch.ones(1)
    call = ph._timed_call(noop)
    ph._root_ids = frozenset([id(root)])
    back = ph._backward_of(noop)
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    optm = sys.modules["torch.optim.optimizer"]
    bare_opt = best(opt.step, 20_000)
    hooks = [optm.register_optimizer_step_pre_hook(ph._opt_pre),
             optm.register_optimizer_step_post_hook(ph._opt_post)]
    hooked_opt = best(opt.step, 20_000)
    for h in hooks:
        h.remove()
    return {
        "root module call": best(lambda: call(root, x)) - best(lambda: noop(root, x)),
        "backward": best(lambda: back(x, None, False, False, inputs=None))
        - best(lambda: noop(x, None, False, False, inputs=None)),
        "optimizer step (two hooks)": hooked_opt - bare_opt,
        "take()": best(ph.take),
    }


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
    calls = per_call()
    for name, us in calls.items():
        print(f"  {name}: {us:+.2f} µs a call")
    print(f"per step (one of each): {sum(calls.values()):+.2f} µs")

if __name__ == "__main__":
    main()
