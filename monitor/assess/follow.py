"""Following a live run: the one reader of "what is new since the last read" (Follower), the
protocol an output of a live run implements (Output), and the one loop that feeds every
output of a run (Follow: a Periodic thread, monitor/periodic.py).

An output is one file and one flag (monitor/manage/outputs.py lists them): the terminal
view (monitor/manage/terminal.py) and the Prometheus exporter (monitor/export/prometheus.py)
are two. It gets the run's new steps and host samples at each tick, and the run's recent
window assessed (the page's KPI window, monitor/assess/recent.py) as often as the most eager
output asks. An output that raises is counted and dropped from that call: a slow or broken
output never stops the others, the store or the job. What the trackers' outputs share lives
here too: a window's figures (window_figures, rank_figures), many ranks' flattened for a
flat tracker (flat_figures), the verdict as text (report), what could not be sent
(said_lost).
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pandas as pd

from monitor.assess.recent import read_recent
from monitor.assess.window import Assessment, Context, assess
from monitor.frames import analysis
from monitor.periodic import Periodic
from monitor.records import TRACKER
from monitor.store import Store

LAG_S = 5.0  # how far back each read looks for steps a rank flushed late
FOLLOW_S = 0.25  # the loop's tick: new rows at most this old when handed over
VERDICT_S = 2.0  # an assessment this often unless an output asks sooner


class Follower:
    """The steps (per rank) and host samples of one run that were not read before. Ranks
    flush on their own clocks, so each read of steps goes back LAG_S before the newest step
    read and drops the (rank, step) pairs already seen."""

    def __init__(self, store: Store, run_id: int, lag_s: float = LAG_S) -> None:
        self.store, self.run_id, self.lag_s = store, run_id, lag_s
        self.seen: dict[tuple[int, int], float] = {}  # (rank, step) read in the last lag_s
        self.samples_to = time.time() - lag_s  # the newest host sample read

    def steps(self) -> pd.DataFrame:
        top = max(self.seen.values(), default=None)
        steps = self.store.steps(self.run_id,
                                 since=top - self.lag_s if top is not None else None)
        if steps.empty:
            return steps
        if "rank" not in steps.columns:
            steps = steps.assign(rank=0)
        ids = list(zip(steps["rank"].astype(int), steps["step"].astype(int), strict=True))
        fresh = [i not in self.seen for i in ids]
        self.seen.update(zip(ids, steps["ts"].astype(float), strict=True))
        newest = max(self.seen.values())
        self.seen = {i: t for i, t in self.seen.items() if t >= newest - self.lag_s}
        return steps[fresh]

    def samples(self) -> pd.DataFrame:
        """The run's host samples newer than the last read."""
        rows = self.store.host_samples(self.samples_to)
        if not rows.empty:
            rows = rows[(rows["ts"] > self.samples_to) & (rows["run_id"] == self.run_id)]
        if not rows.empty:
            self.samples_to = float(rows["ts"].max())
        return rows


def window_figures(steps: pd.DataFrame, host: pd.DataFrame) -> dict[str, float]:
    """The scalars of one window of one rank's steps (and its host rows), NaN-free: the
    data-wait share, samples/s, wait and compute ms a step, device busy (step-derived), the
    phases' shares of compute where timed, the workers' CPU (cores) and memory (MB)."""
    share = analysis.data_wait_share(steps)
    out: dict[str, float] = {
        "data_wait_share": share,
        "samples_per_s": analysis.throughput(steps),
        "wait_ms": float(steps["wait_s"].mean()) * 1e3,
        "compute_ms": float(steps["compute_s"].mean()) * 1e3,
        "device_busy": 1.0 - share,
    }
    compute = float(steps["compute_s"].sum())
    for phase in ("forward", "backward", "optimizer"):
        col = f"{phase}_s"
        if col in steps.columns and steps[col].notna().any() and compute > 0:
            timed = steps[steps[col].notna()]
            out[f"{phase}_share"] = float(timed[col].sum()) / float(timed["compute_s"].sum())
    if not host.empty:
        cpu = host["workers_cpu_pct"].dropna() if "workers_cpu_pct" in host.columns else []
        mem = host["workers_uss_mb"].dropna() if "workers_uss_mb" in host.columns else []
        if len(cpu):
            out["workers_cpu_cores"] = float(cpu.mean()) / 100.0
        if len(mem):
            out["workers_memory_mb"] = float(mem.iloc[-1])
    return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}


def rank_figures(steps: pd.DataFrame, samples: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Each rank's window_figures of one window of new steps (rank 0 where none is said)."""
    ranks = steps["rank"].fillna(0).astype(int) if "rank" in steps.columns else \
        pd.Series(0, index=steps.index)
    return {int(r): window_figures(g, samples) for r, g in steps.groupby(ranks)}


def flat_figures(by_rank: dict[int, dict[str, float]]) -> dict[str, float]:
    """One rank's figures as they are; many ranks' as each figure's min and max over the
    ranks, and the rank with the largest data-wait share (the worst fed)."""
    if len(by_rank) == 1:
        return next(iter(by_rank.values()))
    out: dict[str, float] = {}
    names = {k for f in by_rank.values() for k in f}
    for k in names:
        vals = [f[k] for f in by_rank.values() if k in f]
        out[f"{k}/min"], out[f"{k}/max"] = min(vals), max(vals)
    waits = {r: f.get("data_wait_share", -1.0) for r, f in by_rank.items()}
    out["data_wait_share/worst_rank"] = float(max(waits, key=waits.__getitem__))
    return out


def report(run_id: int | None, a: Any) -> str:
    """The verdict of the run's last window and its advice, in full, as text."""
    d = a.diagnosis
    lines = [f"starvation-monitor run {run_id}: {d.named}", d.headline, ""]
    for x in d.advice:
        pred = x.predicted_throughput
        lines.append(f"- {x.param} = {x.value}" + (f" (predicted {pred:,.0f} samples/s)"
                                                   if pred else "") + f": {x.reason}")
    return "\n".join(lines if d.advice else [*lines, "no advice"]) + "\n"


def said_lost(store: Any, run_id: int | None, tracker: str, text: str, lost: int) -> None:
    """What a tracker's output could not send: one line on stderr, and an event of the run
    (a store that cannot take it: the line is all)."""
    print(f"starvation-monitor: {text}", file=sys.stderr)
    if store is not None and run_id is not None:
        try:
            store.add_event(run_id, TRACKER, text, {"tracker": tracker, "dropped": lost})
        except Exception:
            pass


class Output(Protocol):
    """What follows a live run. `start(run_id)` when the run is recorded; `on_rows` with its
    new steps and host samples each tick (either may be empty); `on_verdict` with its recent
    window assessed (None before it has steps); `close()` after the run has ended. An
    output's constructor claims what it needs (a port), so a flag that cannot be honoured
    fails before the run exists. `verdict_every()`: how often it wants an assessment."""

    name: str
    takes_rows: bool  # whether it takes new rows (none are read for outputs that do not)

    def start(self, run_id: int) -> None: ...

    def on_rows(self, steps: pd.DataFrame, samples: pd.DataFrame) -> None: ...

    def on_verdict(self, a: Assessment | None) -> None: ...

    def verdict_every(self) -> float: ...

    def close(self) -> None: ...


class Follow:
    """The outputs of one live run, fed by one Follower from one Periodic thread."""

    def __init__(self, store: Store, run_id: int, ctx: Context | Callable[[], Context],
                 outputs: Sequence[Output], every: float = FOLLOW_S) -> None:
        self.store, self.run_id, self.outputs = store, run_id, list(outputs)
        self._ctx = ctx
        self.follower = Follower(store, run_id)
        self.errors: dict[str, int] = {}
        self.last_error: dict[str, str] = {}
        self._assessed = 0.0
        self._loop = Periodic("starvation-follow", self.tick, every,
                              finish=self.store.close)

    def ctx(self) -> Context:
        return self._ctx() if callable(self._ctx) else self._ctx

    def start(self) -> Follow:
        self._each("start", self.run_id)
        if self.outputs:
            self._loop.start()
        return self

    def tick(self) -> None:
        # (the terminal view and the exporter take no rows: none are read for them alone)
        if any(getattr(o, "takes_rows", True) for o in self.outputs):
            try:
                steps, samples = self.follower.steps(), self.follower.samples()
            except Exception as exc:  # a store that cannot be read now: the next tick tries
                self._failed("follow", f"read: {type(exc).__name__}: {exc}")
                return
            self._each("on_rows", steps, samples)
        due = min((o.verdict_every() for o in self.outputs), default=VERDICT_S)
        now = time.time()
        if now - self._assessed >= due:
            self._assessed = now
            try:
                a = self.assessment(now)
            except Exception as exc:
                self._failed("follow", f"assess: {type(exc).__name__}: {exc}")
                return
            self._each("on_verdict", a)

    def assessment(self, now: float | None = None) -> Assessment | None:
        """The run's recent window assessed, as the page's KPI row shows it."""
        rec = read_recent(self.store, self.run_id, now if now is not None else time.time())
        return assess(rec.window(), self.ctx()) if rec is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """After the run has ended: the loop, then each output closed."""
        self._loop.stop(timeout)
        self._each("close")

    def _each(self, method: str, *args: Any) -> None:
        for o in self.outputs:
            try:
                getattr(o, method)(*args)
            except Exception as exc:  # one output's failure is its own: counted, said
                self._failed(o.name, f"{method}: {type(exc).__name__}: {exc}")

    def _failed(self, who: str, text: str) -> None:
        self.errors[who] = self.errors.get(who, 0) + 1
        self.last_error[who] = text
