"""The one path from a window of a run to its assessment: summary, features, bound, verdict,
advice and evidence. The page, `measure`, `run --json`, sweeps and the autotuner all call
`assess`; they differ only in which window they pick, and the two choices live here too:

- `steady_window`: a run's final loader settings (its last config generation), less the
  warm-up (thresholds.warmup_seconds of that span). What measure, run, sweep and tune report,
  and what the page shows for a run that has ended.
- `recent_window`: the page's live KPI window, the last KPI_WINDOW_S seconds, or less since the
  last loader change (its warm-up discarded).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from monitor import analysis
from monitor.diagnosis import Diagnosis, Features, diagnose, features
from monitor.diagnosis.thresholds import KPI_WINDOW_S, MIN_STEPS, warmup_seconds
from monitor.records import CpuBudget

if TYPE_CHECKING:
    from monitor.store import Store

UNKNOWN = "unknown"  # accelerator kind of a run that has not said (an older store file)


@dataclass(frozen=True, slots=True)
class Context:
    """What the machine allows, read once by the caller (Runtime.context())."""

    budget: CpuBudget
    max_workers: int
    memory_budget_mb: float | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """Steps and host samples of one run over one stretch of time, with a caption that says
    which stretch (for the page)."""

    run: dict[str, Any]
    steps: pd.DataFrame
    host: pd.DataFrame
    caption: str = ""

    @property
    def accelerator(self) -> str:
        return self.run.get("accelerator_kind") or UNKNOWN


@dataclass(frozen=True, slots=True)
class Assessment:
    run_id: int | None
    features: Features
    diagnosis: Diagnosis
    window_throughputs: tuple[float, ...] = ()  # the window cut into equal parts
    start: float = math.nan  # wall-clock span of the window's steps
    end: float = math.nan

    @property
    def verdict(self) -> str:
        return self.diagnosis.verdict

    @property
    def summary(self) -> analysis.Summary:
        f = self.features
        return analysis.Summary(f.steps, f.window_s, f.throughput, f.data_wait_share,
                                f.device_busy_mean, f.device_busy_cv)

    @property
    def throughput_spread(self) -> float | None:
        """(max - min) / median of the parts' throughputs."""
        w = sorted(self.window_throughputs)
        med = statistics.median(w) if len(w) >= 2 else 0.0
        return (w[-1] - w[0]) / med if med > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The keys every JSON carries for a window (measure, run, sweep rows)."""
        f = self.features.to_dict()
        dg = self.diagnosis
        return {
            **self.summary.to_dict(), "verdict": dg.verdict, "verdict_text": dg.headline,
            "throughput_windows": list(self.window_throughputs),
            "throughput_spread": self.throughput_spread,
            "peak_memory_mb": f["workload_peak_mb"], "accelerator_kind": f["accelerator"],
            "bound": dg.bound, "advice": [a.to_dict() for a in dg.advice],
            "evidence": {k: v for k, v in f.items() if k != "config"},
        }


def _host_of(store: Store, run_id: int, start: float, end: float) -> pd.DataFrame:
    host = store.host_samples(start, end)
    if not host.empty and "run_id" in host.columns:
        host = host[host["run_id"] == run_id]  # another collector may sample another run
    return host


def steady_window(store: Store, run_id: int) -> Window | None:
    """The run's final loader settings, warm-up discarded (None: no such run)."""
    run = store.run(run_id)
    if run is None:
        return None
    steps = store.steps(run_id)
    if steps.empty:
        return Window(run, steps, steps.iloc[0:0], "no steps yet")
    steps = steps[steps["config_seq"] == steps["config_seq"].max()]
    start, end = analysis.span(steps)
    settled = analysis.steady_state(steps, warmup_seconds(end - start))
    if len(settled) >= MIN_STEPS:
        steps = settled
    start, end = analysis.span(steps)
    return Window(run, steps, _host_of(store, run_id, start, end),
                  f"steady state of the final settings ({end - start:.0f} s)")


def recent_window(run: dict[str, Any], steps: pd.DataFrame, host: pd.DataFrame,
                  events: pd.DataFrame, end: float) -> Window:
    """The page's live window: the last KPI_WINDOW_S, or less after a loader change."""
    steps = steps[steps["ts"] >= end - KPI_WINDOW_S]
    cfg = events[events["kind"] == "config"] if not events.empty else events
    caption = f"last {KPI_WINDOW_S:.0f} s"
    if len(cfg) > 1:
        since = float(cfg["ts"].iloc[-1])
        if since > end - KPI_WINDOW_S:
            settle = warmup_seconds(KPI_WINDOW_S)
            steps = steps[steps["ts"] - steps["wait_s"] >= since + settle]
            caption = (f"{end - since:.0f} s since the last change" if len(steps) >= MIN_STEPS
                       else "settling after the last change")
    if not host.empty and not steps.empty:
        start, stop = analysis.span(steps)
        host = host[(host["ts"] >= start) & (host["ts"] <= stop)]
    return Window(run, steps, host, caption)


def split_throughputs(steps: pd.DataFrame, parts: int) -> tuple[float, ...]:
    """Throughput of each of `parts` equal stretches of the steps' span (empty ones left
    out)."""
    if steps.empty or parts < 2:
        return ()
    start, end = analysis.span(steps)
    edges = [start + (end - start) * i / parts for i in range(parts + 1)]
    out = (analysis.throughput(steps[(steps["ts"] >= a) & (steps["ts"] < b)])
           for a, b in zip(edges[:-1], edges[1:], strict=True))
    return tuple(t for t in out if not math.isnan(t))


def assess(window: Window, ctx: Context, parts: int = 1) -> Assessment:
    """Summary, features, bound, verdict and advice of one window."""
    f = features(window.steps, window.host, window.run.get("config") or {}, ctx.budget,
                 window.accelerator, ctx.memory_budget_mb)
    start, end = analysis.span(window.steps) if not window.steps.empty else (math.nan,) * 2
    return Assessment(window.run.get("id"), f, diagnose(f, ctx.max_workers),
                      split_throughputs(window.steps, parts), start, end)


def assess_run(store: Store, run_id: int, ctx: Context, parts: int = 1) -> Assessment | None:
    """assess(steady_window(...)): what measure, run --json and sweep rows report."""
    w = steady_window(store, run_id)
    return assess(w, ctx, parts) if w is not None else None
