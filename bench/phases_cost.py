"""What the step-phase timing (monitor/probe/phases.py) costs a step, and where, in one
process: a Linear model's training step (forward, backward, optimizer step, zero_grad) bare,
then with the phases sampled as the probe runs them (NOTE [phase sampling]: one step timed
per SAMPLE_S of loop), then with every step timed (as before sampling), in interleaved
rounds of 10,000 steps each.

The sampled figure is the mean cost per step, from medians: steps are put in three kinds
(not timed; not timed, the next one timed; timed) and each kind's median step, weighted by
how many steps were of that kind, against the bare median (a plain mean moves with the box's
stalls by more than the budget). The every-step figure is the median step against bare,
with each part of the step alone (the median of 5,000 calls). Goal (issue 34): phases on
within 2 µs of off. Figures only.

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

    def steps(n: int, ph: Phases | None = None) -> tuple[list[float], list[int]]:
        """Each step's seconds, and its kind: 0 not timed, 1 not timed and the next one
        timed, 2 timed."""
        tops, kinds = [], []
        for _ in range(n):
            tops.append(time.perf_counter())
            timed = ph is not None and ph.armed
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if ph is not None:
                ph.take(time.perf_counter())
            kinds.append(2 if timed else 1 if ph is not None and ph.armed else 0)
        tops.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(tops)], kinds

    def med(ts: list[float]) -> float:
        return statistics.median(ts) * 1e6

    def weighted(ts: list[float], kinds: list[int]) -> tuple[float, float, float]:
        """(mean µs a step from each kind's median, the share of steps timed, the timed
        step's median µs)."""
        by = {k: [t for t, kk in zip(ts, kinds, strict=True) if kk == k] for k in (0, 1, 2)}
        mean = sum(len(v) * med(v) for v in by.values() if v) / len(ts)
        return mean, len(by[2]) / len(ts), med(by[2]) if by[2] else float("nan")

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
    sampled_d, every_d = [], []
    for r in range(a.rounds):
        bare = med(steps(a.steps)[0])
        bare_parts = parts()
        ph = Phases(lambda why: print(f"phases failed: {why}", file=sys.stderr))
        if not ph.install():
            sys.exit("phases could not be installed")
        steps(10, ph)  # the discovery steps: the roots found, the global module hooks gone
        mean, share, timed = weighted(*steps(a.steps, ph))
        if not ph.armed:  # every step timed from here (sampling off)
            ph._swap(True)
        ph.sampling, ph.armed = False, True
        every, every_parts = med(steps(a.steps, ph)[0]), parts()
        ph.remove()
        sampled_d.append(mean - bare)
        every_d.append(every - bare)
        each = ", ".join(f"{k} {every_parts[k] - bare_parts[k]:+.2f}" for k in bare_parts)
        print(f"round {r}: bare {bare:.2f} µs/step; sampled {mean:.2f} ({mean - bare:+.2f}: "
              f"{share:.2%} of steps timed, a timed step {timed - bare:+.2f}); every step "
              f"timed {every:.2f} ({every - bare:+.2f}; by part: {each} µs)", flush=True)
    for name, d in (("sampled (as the probe runs)", sampled_d), ("every step timed", every_d)):
        print(f"phases {name} against off: {statistics.median(d):+.2f} µs/step "
              f"({min(d):+.2f} to {max(d):+.2f}), median of {a.rounds} rounds")


if __name__ == "__main__":
    main()
