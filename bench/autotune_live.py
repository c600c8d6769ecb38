"""The live autotuner against a grid of fresh runs, head to head.

    python bench/autotune_live.py [--presets starving,io-bound,cpu-bound,healthy]
        [--script "examples/train_small.py --epochs 8"] [--seconds 6] [--verify 2]

Per preset (the managed workload): a grid of fresh runs (num_workers 0..3x usable cores x
prefetch_factor 1, 2, 4) finds the best fixed setting; then the workload is started at
num_workers=0 and tuned live, window by window (the page's Auto-tune), until it settles or
--max-s passes. Per script (an attached user script that takes --num-workers N and prints
"... samples/s" per epoch): bare runs at num_workers 0..3x cores find the best, then
`monitor run --autotune` tunes it epoch by epoch. Then the live pick and the grid's best
are measured head to head (interleaved runs of the same length, ABBA) and their ratio is
printed. Figures only.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import LoaderConfig
from monitor.manage.experiment import Experiments
from monitor.manage.runtime import Runtime
from monitor.tuning.live import Cadence, LiveTuner
from monitor.tuning.policy import describe_settings
from monitor.tuning.search import describe, find_knee, grid

ROOT = Path(__file__).resolve().parent.parent
ROWS: list[tuple] = []


def abba(measure, a, b, times: int) -> tuple[list[float], list[float]]:
    out: tuple[list[float], list[float]] = ([], [])
    for i in range(times):
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            out[j].append(round(measure((a, b)[j]), 1))
    return out


def preset_row(rt: Runtime, preset: str, a: argparse.Namespace) -> None:
    base = LoaderConfig.build(preset=preset)
    exp = Experiments(rt, a.seconds)
    g = exp.sweep(grid(base, {"num_workers": list(range(rt.max_workers + 1)),
                              "prefetch_factor": [1, 2, 4]}))
    best = find_knee(g.results).best.config
    start = base.replace(step_time_ms=exp.pinned_step_ms) if exp.pinned_step_ms else base
    run_id = rt.manager.start(start, name=f"{preset} live autotune")
    mgr = rt.manager

    def request(settings: dict, source: str) -> int | None:
        return mgr.reconfigure(mgr.config.replace(**settings), source=source)

    tuner = LiveTuner(rt.store, run_id, rt.context(), cadence=Cadence("window", a.window),
                      request=request).start()
    t0, tick = time.monotonic(), threading.Event()
    while tuner.alive and time.monotonic() - t0 < a.max_s:
        tick.wait(0.5)
    live_s = time.monotonic() - t0
    tuner.stop()
    mgr.stop()
    s = tuner.summary()
    final = base.replace(**s["final"]) if s.get("final") else base
    ratio, pairs = 1.0, None
    if final != best and a.verify:
        pairs = abba(lambda c: exp.measure(c).throughput or 0.0, best, final, a.verify)
        ratio = statistics.median(pairs[1]) / statistics.median(pairs[0])
    print(f"{preset}: grid best {describe(best)} ({len(g.results)} runs, {g.seconds:.0f} s); "
          f"live {describe_settings(s['start'])} -> {describe_settings(s['final'])} in "
          f"{s['observed']} windows, {live_s:.0f} s: {s['settled']}; head to head "
          f"{pairs} -> {ratio:.3f}", flush=True)
    ROWS.append((preset, describe_settings(s["start"]), describe_settings(s["final"]),
                 f"{s['observed']} windows", s.get("final_throughput") or 0.0, describe(best),
                 ratio))


def bare_rate(cmd: list[str], nw: int) -> float:
    r = subprocess.run([*cmd, "--num-workers", str(nw)], capture_output=True, text=True,
                       cwd=ROOT, check=True)
    rates = [float(x.replace(",", "")) for x in re.findall(r"([\d,.]+) samples/s", r.stdout)]
    return statistics.median(rates[1:] or rates)


def script_row(spec: str, top: int, a: argparse.Namespace) -> None:
    args = shlex.split(spec)
    # the grid's and the head-to-head runs: the same script, shorter if --grid-args says so
    cmd = [sys.executable, args[0], *(shlex.split(a.grid_args) if a.grid_args else args[1:])]
    t = time.monotonic()
    rates = {nw: bare_rate(cmd, nw) for nw in range(top + 1)}
    grid_s = time.monotonic() - t
    best = max(rates, key=rates.get)
    db = Path(tempfile.mkdtemp()) / "live.db"
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        "--autotune", "--", sys.executable, *args], capture_output=True,
                       text=True, cwd=ROOT)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    s = d["autotune"]
    final = int(s["final"]["num_workers"])
    ratio, pairs = 1.0, None
    if final != best and a.verify:
        pairs = abba(lambda nw: bare_rate(cmd, nw), best, final, a.verify)
        ratio = statistics.median(pairs[1]) / statistics.median(pairs[0])
    moves = [(m["settings"]["num_workers"], round(m["throughput"]), m["kept"])
             for m in s["moves"]]
    print(f"{spec}: grid ({' '.join(cmd[1:])}) {rates} ({grid_s:.0f} s); live "
          f"{describe_settings(s['start'])} -> {describe_settings(s['final'])} in "
          f"{s['observed']} epochs: {s['settled']}; moves {moves}; head to head {pairs} -> "
          f"{ratio:.3f}", flush=True)
    ROWS.append((Path(args[0]).name, describe_settings(s["start"]),
                 describe_settings(s["final"]), f"{s['observed']} epochs",
                 s.get("final_throughput") or 0.0, f"num_workers={best}", ratio))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="starving,io-bound,cpu-bound,healthy,memory-heavy")
    ap.add_argument("--script", action="append", default=[],
                    help='a script and its arguments, e.g. "examples/train_small.py --epochs 8"')
    ap.add_argument("--grid-args", default=None,
                    help='the script\'s arguments for the grid and head-to-head runs (default: '
                         'those of --script), e.g. "--epochs 3 --samples 1024"')
    ap.add_argument("--seconds", type=float, default=6.0, help="each grid run's window")
    ap.add_argument("--window", type=float, default=8.0, help="the live measurement window")
    ap.add_argument("--max-s", type=float, default=150.0, help="live tuning time limit")
    ap.add_argument("--verify", type=int, default=2)
    a = ap.parse_args()
    rt = Runtime(Path(tempfile.mkdtemp()) / "live.db").start()
    try:
        for preset in filter(None, a.presets.split(",")):
            preset_row(rt, preset, a)
    finally:
        rt.close()
    for spec in a.script:
        script_row(spec, rt.max_workers, a)
    print(f"\n{'workload':<16} {'start':<26} {'final':<38} {'used':<11} {'final/s':>8} "
          f"{'grid best':<40} {'h2h':>6}")
    for w, st, fi, used, thr, gb, ratio in ROWS:
        print(f"{w:<16} {st:<26} {fi:<38} {used:<11} {thr:8.0f} {gb:<40} {ratio:6.3f}")


if __name__ == "__main__":
    main()
