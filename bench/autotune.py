"""Grid sweep vs autotune, back to back, on each preset.

    python bench/autotune.py [--seconds 6] [--presets starving,io-bound,cpu-bound]

The grid is num_workers 0..2x cores x prefetch_factor {1, 2, 4}. Prints per preset: the
grid's best (configuration and samples/s), the autotuner's pick and its measured samples/s,
their ratio, the grid's own measurement of the autotuner's pick, and the time ratio
(autotune seconds / grid seconds). Single measurements on a shared 2-core VM drift by 10-15%
between minutes, so the two picks are then verified head to head: measured alternately,
`--verify` times each, and the ratio of their medians printed. Figures only.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import LoaderConfig
from monitor.runtime import Runtime
from monitor.tuning.experiment import Experiments
from monitor.tuning.search import describe, find_knee, grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--presets", default="starving,io-bound,cpu-bound")
    ap.add_argument("--verify", type=int, default=2)
    a = ap.parse_args()
    rt = Runtime(Path(tempfile.mkdtemp()) / "autotune.db").start()
    top = rt.max_workers
    try:
        for preset in a.presets.split(","):
            base = LoaderConfig.build(preset=preset)
            configs = grid(base, {"num_workers": list(range(top + 1)),
                                  "prefetch_factor": [1, 2, 4]})
            runner = Experiments(rt, a.seconds)
            g = runner.sweep(configs)
            knee = find_knee(g.results)
            t = runner.tune(base, top)
            tb = t.best or {}
            tuned = tb.get("throughput") or 0.0
            picked = LoaderConfig.from_dict(tb["config"]) if tb else None
            in_grid = next((r.throughput for r in g.results if r.config == picked), None)
            print(f"{preset}: grid best {describe(knee.best.config)} "
                  f"{knee.best.throughput:.1f} samples/s ({len(g.results)} configs, "
                  f"{g.seconds:.0f} s)")
            print(f"{preset}: autotune {describe(picked) if picked else '-'} {tuned:.1f} "
                  f"samples/s ({len(t.results)} configs, {t.seconds:.0f} s); grid measured "
                  f"that config at {in_grid or float('nan'):.1f}")
            verified = 1.0
            if picked is not None and picked != knee.best.config and a.verify:
                pairs = {"best": [], "pick": []}
                for _ in range(a.verify):
                    pairs["best"].append(runner.measure(knee.best.config).throughput)
                    pairs["pick"].append(runner.measure(picked).throughput)
                verified = statistics.median(pairs["pick"]) / statistics.median(pairs["best"])
                print(f"{preset}: head to head: grid best {pairs['best']}, autotune pick "
                      f"{pairs['pick']}")
            print(f"{preset}: ratio {tuned / knee.best.throughput:.3f} (as measured), "
                  f"{verified:.3f} (head to head), time ratio {t.seconds / g.seconds:.3f}",
                  flush=True)
    finally:
        rt.close()


if __name__ == "__main__":
    main()
