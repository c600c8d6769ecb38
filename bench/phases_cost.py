"""What the step-phase timing (monitor/probe/phases.py) costs a step, and where, in one
process: a Linear model's training step (forward, backward, optimizer step, zero_grad) bare,
then with the phases installed (past their discovery steps), then bare again, in interleaved
rounds; each figure the median step of 10,000, and each part of the step alone (the median of
5,000 calls). Goal (issue 34): phases on within 2 µs of off. Figures only.

    python bench/phases_cost.py [--rounds 3] [--steps 10000]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10_000)
    a = ap.parse_args()
    import torch

    from monitor.probe.phases import Phases

    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.ones(2, 4)

    def steps(n: int, ph: Phases | None = None) -> float:
        tops = []
        for _ in range(n):
            tops.append(time.perf_counter())
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if ph is not None:
                ph.take()
        tops.append(time.perf_counter())
        return statistics.median(b - a for a, b in itertools.pairwise(tops)) * 1e6

    def median_us(fn, n: int = 5_000) -> float:
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    def backward_us(n: int = 5_000) -> float:
        ts = []
        for _ in range(n):
            y = model(x).sum()
            t = time.perf_counter()
            y.backward()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    def parts() -> dict[str, float]:
        return {"forward": median_us(lambda: model(x)), "backward": backward_us(),
                "optimizer step": median_us(opt.step)}

    steps(3_000)  # warm
    diffs = []
    for r in range(a.rounds):
        bare, bare_parts = steps(a.steps), parts()
        ph = Phases(lambda why: print(f"phases failed: {why}", file=sys.stderr))
        if not ph.install():
            sys.exit("phases could not be installed")
        steps(10, ph)  # the discovery steps: the roots found, the global module hooks gone
        on, on_parts = steps(a.steps, ph), parts()
        ph.remove()
        diffs.append(on - bare)
        each = ", ".join(f"{k} {on_parts[k] - bare_parts[k]:+.2f}" for k in bare_parts)
        print(f"round {r}: bare {bare:.2f} µs/step, phases on {on:.2f} ({on - bare:+.2f}); "
              f"by part: {each} µs", flush=True)
    print(f"phases on against off: {statistics.median(diffs):+.2f} µs/step "
          f"({min(diffs):+.2f} to {max(diffs):+.2f}), median of {a.rounds} rounds")


if __name__ == "__main__":
    main()
