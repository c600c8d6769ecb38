"""Measure the presets' namesake behaviour with the same managed workload as the page.

    python bench/presets.py [--seconds 10] [--repeat 1] [--db PATH]

Prints, per (preset, num_workers), throughput, data-wait share, device busy mean/CV, and the
speed-up over num_workers=0 of the same preset. Figures only; nothing is asserted.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import LoaderConfig
from monitor.manage.measure import measure
from monitor.manage.runtime import Runtime

CASES = [
    ("starving", 0), ("starving", 2),
    ("healthy", 0),
    ("io-bound", 0), ("io-bound", 2), ("io-bound", 4),
    ("cpu-bound", 0), ("cpu-bound", 2), ("cpu-bound", 4),
    ("memory-heavy", 0), ("memory-heavy", 2),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default=None, help="comma-separated presets")
    ap.add_argument("--db", default=None)
    a = ap.parse_args()
    rt = Runtime(a.db or Path(tempfile.mkdtemp()) / "bench.db").start()
    only = set(a.only.split(",")) if a.only else None
    base: dict[str, float] = {}
    print(f"{'preset':<13}{'workers':>8}{'samples/s':>11}{'wait share':>12}{'busy mean':>11}"
          f"{'busy CV':>9}{'vs w=0':>8}  verdict")
    try:
        _cases(rt, a, only, base)
    finally:
        rt.close()


def _cases(rt: Runtime, a: argparse.Namespace, only: set | None, base: dict) -> None:
    for preset, nw in CASES:
        if only and preset not in only:
            continue
        rows = []
        for _ in range(a.repeat):
            cfg = LoaderConfig.build(preset=preset, num_workers=nw)
            m = measure(rt, cfg, a.seconds)
            rows.append(m.assessment)
        thr = statistics.median(r.summary.throughput for r in rows)
        share = statistics.median(r.summary.data_wait_share for r in rows)
        if nw == 0:
            base[preset] = thr
        ratio = thr / base[preset] if preset in base else float("nan")
        print(f"{preset:<13}{nw:>8}{thr:>11.1f}{share:>12.3f}"
              f"{statistics.median(r.summary.device_busy_mean for r in rows):>11.3f}"
              f"{statistics.median(r.summary.device_busy_cv for r in rows):>9.2f}{ratio:>8.2f}  "
              f"{rows[0].verdict}{_spread(rows)}", flush=True)


def _spread(rows: list) -> str:
    if len(rows) < 2:
        return ""
    return "  (shares: " + ", ".join(f"{r.summary.data_wait_share:.2f}" for r in rows) + ")"


if __name__ == "__main__":
    main()
