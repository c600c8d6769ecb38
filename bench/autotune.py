"""`monitor tune` against a grid sweep, on each preset, head to head.

    python bench/autotune.py [--seconds 6] [--presets starving,io-bound,...]

The grid is num_workers 0..3x usable cores x prefetch_factor {1, 2, 4}. Per preset it
prints the grid's best (configuration, samples/s, configurations, seconds) and the tuner's
pick (the same, plus its settled line). A shared 2-core VM drifts 10-15% between minutes, so
the two picks are then measured head to head: alternately, `--verify` times each, with runs
of the same length, and the ratio of their medians printed, with the time ratio (tune
seconds / grid seconds). Figures only: the goal is >= 0.95 of the grid's best in <= 0.35 of
its time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import LoaderConfig
from monitor.manage.experiment import Experiments
from monitor.manage.runtime import Runtime
from monitor.tuning.search import describe, find_knee, grid


def head_to_head(runner: Experiments, a: LoaderConfig, b: LoaderConfig, times: int,
                 ) -> tuple[list[float], list[float]]:
    """Interleaved runs of equal length: a, b, b, a, a, b, ... (ABBA against drift)."""
    out: tuple[list[float], list[float]] = ([], [])
    for i in range(times):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for j in order:
            out[j].append(runner.measure((a, b)[j]).throughput or 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--presets", default="starving,io-bound,cpu-bound,healthy,memory-heavy")
    ap.add_argument("--verify", type=int, default=3)
    a = ap.parse_args()
    rt = Runtime(Path(tempfile.mkdtemp()) / "autotune.db").start()
    top = rt.max_workers
    rows = []
    try:
        for preset in a.presets.split(","):
            base = LoaderConfig.build(preset=preset)
            configs = grid(base, {"num_workers": list(range(top + 1)),
                                  "prefetch_factor": [1, 2, 4]})
            runner = Experiments(rt, a.seconds)
            g = runner.sweep(configs)
            knee = find_knee(g.results)
            t = Experiments(rt, a.seconds)
            t.pinned_step_ms = runner.pinned_step_ms  # the same device for both
            ts = t.tune(base, top)
            tb = ts.best or {}
            picked = LoaderConfig.from_dict(tb["config"]) if tb else base
            print(f"{preset}: grid best {describe(knee.best.config)} "
                  f"{knee.best.throughput:.1f} samples/s ({len(g.results)} configs, "
                  f"{g.seconds:.0f} s)")
            print(f"{preset}: tune {describe(picked)} {tb.get('throughput') or 0:.1f} "
                  f"samples/s ({len(ts.results)} runs, {ts.seconds:.0f} s): "
                  f"{tb.get('settled')}")
            ratio = 1.0
            if picked != knee.best.config and a.verify:
                best_runs, pick_runs = head_to_head(runner, knee.best.config, picked,
                                                    a.verify)
                ratio = statistics.median(pick_runs) / statistics.median(best_runs)
                print(f"{preset}: head to head: grid best {[round(x) for x in best_runs]}, "
                      f"tune pick {[round(x) for x in pick_runs]}")
            rows.append((preset, describe(knee.best.config), describe(picked), ratio,
                         ts.seconds / g.seconds, len(ts.results), len(g.results)))
            print(f"{preset}: head to head {ratio:.3f}, time ratio "
                  f"{ts.seconds / g.seconds:.3f}", flush=True)
    finally:
        rt.close()
    print(f"\n{'preset':<10} {'grid best':<50} {'tune pick':<50} {'h2h':>6} {'time':>6} runs")
    for p, gb, tp, r, tr, n, m in rows:
        print(f"{p:<10} {gb:<50} {tp:<50} {r:6.3f} {tr:6.3f} {n}/{m}"
              f"  {'met' if r >= 0.95 and tr <= 0.35 else 'NOT met'}")


if __name__ == "__main__":
    main()
