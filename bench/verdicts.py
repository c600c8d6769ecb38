"""The verdict matrix on a quiet and a busy host: each cell a managed run of its own, with
0, 1 and 2 processes of ours keeping a core busy each, printing the verdict and the measured
evidence behind it (the loaders' share of time on a CPU, waiting for one, blocked; their
reads; other processes' CPU). `python bench/verdicts.py [--seconds 6]`."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import LoaderConfig
from monitor.manage.measure import measure
from monitor.manage.runtime import Runtime

CELLS = [("starving", 0), ("cpu-bound", 2), ("io-bound", 0), ("io-bound", 2), ("healthy", 0)]


def pct(v: float | None) -> str:
    return "  –" if v is None else f"{v:3.0%}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--db", default="/tmp/starvation-verdicts.db")
    a = ap.parse_args()
    Path(a.db).unlink(missing_ok=True)
    print(f"{'cell':<14}{'busy':>5}  {'verdict':<15}{'on-CPU':>7}{'CPU wait':>9}"
          f"{'blocked':>8}{'KB/smp':>7}{'other':>6}  samples/s")
    with Runtime(a.db) as rt:
        rt.start()
        for busy in (0, 1, 2):
            for preset, nw in CELLS:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(busy)]
                try:
                    m = measure(rt, LoaderConfig.build(preset=preset, num_workers=nw),
                                a.seconds)
                finally:
                    for h in hogs:
                        h.kill()
                        h.wait()
                ev = m.assessment.to_dict()["evidence"]
                kb = ev.get("read_per_sample_kb")
                print(f"{preset + '@' + str(nw):<14}{busy:>5}  {m.assessment.verdict:<15}"
                      f"{pct(ev.get('loading_cpu_per_wall')):>7}"
                      f"{pct(ev.get('loaders_runq_share')):>9}"
                      f"{pct(ev.get('loaders_blocked_share')):>8}"
                      f"{'–' if kb is None else f'{kb:.1f}':>7}"
                      f"{ev.get('other_cpu_cores') or 0:>6.2f}  {m.summary.throughput:,.0f}",
                      flush=True)


if __name__ == "__main__":
    main()
