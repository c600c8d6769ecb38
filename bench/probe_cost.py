"""What the probe costs the training loop, per step amortised (the writer's flushes and
the watchdog's thread included), each case head to head with its bare loop in interleaved
rounds of equal length:

- `watch()` over an iterator that yields at once (in this process): the probe alone;
- the attach probe (installed as `monitor run` installs it) on a plain `for batch in
  loader:` over a DataLoader whose items cost nothing, with 0 and with 2 workers, and
  `watch()` over the same loader: one process per run (bench/probe_loop.py), its first
  epoch (start-up) left out;
- a loop with a 1 ms step (a spin) over that DataLoader: its throughput monitored against
  bare, in percent;
- the same loops under the whole of `monitor run` (the relay: no thread of the probe's wakes
  beside the loop; its sampler runs beside the script).

    python bench/probe_cost.py [--steps 20000] [--rounds 5] [--table]

Without --table only the first case. Prints each round and the medians (with their spread,
min-max over the rounds). Goal (issue 33): <= 5 µs a step, the 1 ms loop within 0.5%.
Figures only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# (what, mode, workers, steps an epoch, epochs, the step's ms, "model": a model's step;
# "phases-off": the probe with --no-phases as the baseline instead of bare)
CASES = (("attach probe, DataLoader 0 workers", "probed", 0, 20_000, 4, 0.0, ""),
         ("attach probe, DataLoader 2 workers", "probed", 2, 5_000, 4, 0.0, ""),
         ("watch(), DataLoader 0 workers", "watch", 0, 20_000, 4, 0.0, ""),
         ("1 ms step, DataLoader 0 workers, a run's first 15 s", "probed", 0, 1_500, 3, 1.0,
          ""),
         ("1 ms step, DataLoader 0 workers, after 15 s", "probed", 0, 1_500, 14, 1.0,
          "steady"),
         ("monitor run (the relay), DataLoader 0 workers", "run", 0, 20_000, 4, 0.0, ""),
         ("1 ms step under monitor run (the relay)", "run", 0, 1_500, 14, 1.0, "steady"),
         ("a Linear model's step: phases on against off", "probed", 0, 5_000, 4, 0.0,
          "phases"),
         ("a Linear model's step under monitor run: phases on against off", "run", 0, 5_000,
          4, 0.0, "phases-run"))
# "steady": only the epochs that start after the probe's young period (the writer's thread
# wakes every 0.5 s for a run's first 15 s, then every 2 s: monitor/probe/watchdog.py)
STEADY_FROM_S = 16.0


class Trivial:
    """A loader that yields at once: what is measured is the probe alone."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.num_workers, self.batch_size, self.pin_memory = 0, 1, False

    def __iter__(self):
        return iter(range(self.n))


def loop(it) -> float:
    t = time.perf_counter()
    for _ in it:
        pass
    return time.perf_counter() - t


GAPS: dict[str, list[tuple[float, float]]] = {}  # case -> (bare, monitored) median gap µs


def one(mode: str, workers: int, steps: int, epochs: int, ms: float, kind: str = "",
        gaps: list[float] | None = None) -> float:
    """Median µs a step of one process's epochs after its first. `kind` "phases": a model's
    step, the probe's phases on ("probed") or off ("bare": the probe with them off). With
    a step (ms > 0) the same epochs' median gap between steps goes onto `gaps`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "STARVATION_MONITOR_DB": str(Path(tempfile.mkdtemp()) / "p.db")}
    extra = []
    if kind.startswith("phases"):  # "phases-run": both under `monitor run`
        extra = ["model"]
        if mode == "bare":
            mode = "run" if kind == "phases-run" else "probed"
            env["STARVATION_MONITOR_PHASES"] = "0"
    # "run": the whole of `monitor run` (its sampler and the relay beside the script, which
    # the probe is injected into): the steps leave through the relay's ring, no thread
    # of the probe's wakes beside the loop (NOTE [the relay] in monitor/manage/relay.py)
    wrap = [sys.executable, "-m", "monitor", "run", "--db", env["STARVATION_MONITOR_DB"],
            "--"] if mode == "run" else []
    r = subprocess.run([*wrap, sys.executable, str(ROOT / "bench" / "probe_loop.py"),
                        "bare" if mode == "run" else mode,
                        str(workers), str(steps), str(epochs), str(ms), *extra], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
    # a model's step: the median step, whose cost is the phase hooks' (the box's stalls
    # move the mean by more than the 2 µs budget)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith(
        "median_step_us" if kind.startswith("phases") else "us_per_step"))
    per_epoch = [float(x) for x in line.split()[1:]]
    gap = next((ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("gap_us")), [])
    keep = list(range(1, len(per_epoch)))
    if kind == "steady":
        start, keep = 0.0, []
        for i, us in enumerate(per_epoch):
            if start >= STEADY_FROM_S:
                keep.append(i)
            start += us * steps / 1e6
    if gaps is not None and gap:
        gaps.append(statistics.median(float(gap[i].split("/")[0]) for i in keep))
    return statistics.median(per_epoch[i] for i in keep)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def table(rounds: int, only: str = "") -> None:
    """Each case bare and probed, the order alternating round by round (`only`: the cases
    whose name holds it)."""
    cases = [c for c in CASES if only in c[0]]
    got: dict[str, list[tuple[float, float]]] = {c[0]: [] for c in cases}
    for r in range(rounds):
        for what, mode, nw, steps, epochs, ms, kind in cases:
            pair = ["bare", mode] if r % 2 == 0 else [mode, "bare"]
            g: dict[str, list[float]] = {m: [] for m in pair}
            t = {m: one(m, nw, steps, epochs, ms, kind, g[m]) for m in pair}
            got[what].append((t["bare"], t[mode]))
            if g["bare"] and g[mode]:
                GAPS.setdefault(what, []).append((g["bare"][0], g[mode][0]))
            print(f"round {r} {what}: bare {t['bare']:.2f}, monitored {t[mode]:.2f} µs/step",
                  flush=True)
    print("\n| case | bare µs/step | monitored µs/step | probe cost |")
    print("|---|---|---|---|")
    for what, *_rest in cases:
        b = [x for x, _ in got[what]]
        m = [y for _, y in got[what]]
        if _rest[-2] > 0:  # a real step: the cost as throughput lost
            cost = [(y / x - 1) * 100 for x, y in got[what]]
            print(f"| {what} | {spread(b)} | {spread(m)} | {spread(cost)} % of throughput |")
            if what in GAPS:  # the loop's own time between steps: next() and the probe
                gb, gm = [x for x, _ in GAPS[what]], [y for _, y in GAPS[what]]
                d = [y - x for x, y in GAPS[what]]
                print(f"| {what}: between steps (median) | {spread(gb)} | {spread(gm)} | "
                      f"{spread(d)} µs/step ({statistics.median(d) / 10:.2f}% of 1 ms) |")
        else:
            cost = [y - x for x, y in got[what]]
            print(f"| {what} | {spread(b)} | {spread(m)} | {spread(cost)} µs/step |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--table", action="store_true", help="every case, as a markdown table")
    ap.add_argument("--only", default="", help="with --table: the cases whose name holds this")
    ap.add_argument("--busy", action="store_true",
                    help="keep one core busy throughout (another process spinning)")
    a = ap.parse_args()
    if a.busy:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            return _main(a)
        finally:
            spinner.kill()
            spinner.wait()
    return _main(a)


def _main(a: argparse.Namespace) -> None:
    os.environ["STARVATION_MONITOR_DB"] = str(Path(tempfile.mkdtemp()) / "probe.db")
    from monitor import watch

    bare, watched = [], []
    for _ in range(a.rounds):
        bare.append(loop(Trivial(a.steps)) / a.steps * 1e6)
        watched.append(loop(watch(Trivial(a.steps))) / a.steps * 1e6)
    for i, (b, w) in enumerate(zip(bare, watched, strict=True)):
        print(f"round {i}: bare {b:.2f} µs/step, watched {w:.2f} µs/step")
    diff = statistics.median(w - b for b, w in zip(bare, watched, strict=True))
    print(f"probe cost: {diff:.2f} µs per step (median of {a.rounds} interleaved rounds, "
          f"{a.steps} steps each, flushes included)")
    print(f"device clock (CUDA events, our side only: a no-op event): "
          f"{device_clock_us(a.steps):.2f} µs per step for its two records and the harvest "
          "(the driver's own cudaEventRecord, ~2.5 µs each, is on top: bench/gpu_check.py)")
    if a.table:
        table(a.rounds, a.only)


class _NoopEvent:
    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: object) -> float:
        return 1.0


class _NoopCuda:
    def is_initialized(self) -> bool:
        return True

    def Event(self, enable_timing: bool = False) -> _NoopEvent:  # torch's name
        return _NoopEvent()


def device_clock_us(steps: int) -> float:
    """Per step: batch_arrived + batch_done + harvest, on events that cost nothing."""
    from monitor.probe.device_clock import DeviceClock

    clock = DeviceClock(_NoopCuda())
    t = time.perf_counter()
    for i in range(steps):
        clock.batch_arrived(i)
        clock.batch_done()
        clock.harvest()
    return (time.perf_counter() - t) / steps * 1e6


if __name__ == "__main__":
    main()
