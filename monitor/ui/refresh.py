"""What one refresh of the live region computes, without streamlit: the View of its window
read (monitor/ui/view.py), the assessment the KPI row shows and the figures; a running
run's refresh shared by tabs for SHARE_S, an ended run's computed once (its data cannot
change) and its whole-run view warmed in the background. bench/ui_tick.py times exactly
this."""
from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from monitor.assess.window import Assessment, assess, steady_window
from monitor.caching import Bounded
from monitor.diagnosis import SIMULATED
from monitor.frames import analysis
from monitor.store import RUNNING, Store
from monitor.ui import charts
from monitor.ui.view import View, assessed_window, load_view, rank_view


@dataclass(frozen=True, slots=True)
class Refresh:
    """What one refresh of the live region shows."""

    view: View
    assessment: Assessment
    caption: str
    accelerator: str
    figures: dict


def refresh(rt: Any, run_id: int, window_s: float | None, gpus: bool = True,
            pick: int | None = None, gpu: int | None = None,
            now: float | None = None) -> Refresh | None:
    """Everything the live region computes, once per second for a running run; for an
    ended one, once (its data cannot change: cached by its end time)."""
    run = rt.store.run(run_id)
    if run is None:
        return None
    ended = run.get("ended_at")
    if run["status"] != RUNNING and isinstance(ended, float) and not math.isnan(ended):
        ctx = Unkeyed(rt.context())
        done = _refresh_ended(str(rt.store.path), run_id, float(ended), window_s, gpus,
                              pick, gpu, ctx)
        if window_s is not None:  # the whole run is the next view asked of an ended run
            _warm((str(rt.store.path), run_id, float(ended), None, gpus, pick, gpu, ctx))
        return done
    if now is not None:
        return _compute(rt, rt.store, run_id, window_s, gpus, pick, gpu, now)
    key = (str(rt.store.path), run_id, window_s, gpus, pick, gpu)
    hit = _SHARED.get(key)
    if hit is not None and time.monotonic() - hit[0] < SHARE_S:
        return hit[1]
    r = _compute(rt, rt.store, run_id, window_s, gpus, pick, gpu)
    _SHARED.put(key, (time.monotonic(), r))  # other tabs refreshing within SHARE_S reuse it
    return r


SHARE_S = 0.9  # tabs showing the same view within this long share one computation
_SHARED: Bounded[tuple, tuple[float, Refresh | None]] = Bounded(32)


def _compute(rt: Any, store: Store, run_id: int, window_s: float | None, gpus: bool,
             pick: int | None, gpu: int | None, now: float | None = None) -> Refresh | None:
    view = load_view(store, run_id, window_s, now=now, gpus=gpus)
    if view is None:
        return None
    a, caption, accel = assessment(rt, view)
    figs = chart_figures(rank_view(view, pick), accel == SIMULATED, gpu)
    return Refresh(view, a, caption, accel, figs)


@dataclass(frozen=True, slots=True)
class Unkeyed:
    """A value handed to a cached function that is not part of its key: an ended run's
    figures are computed once, with the machine's context of the call that fills the cache
    (later calls' contexts, read anew each time, would make every call a miss)."""

    value: Any

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unkeyed)


_WARMED: Bounded[tuple, None] = Bounded(64)  # the whole-run views warmed


def _warm(key: tuple) -> None:
    """Compute an ended run's whole-run view in the background, once, while its first view
    is being looked at: a day-long run's whole view then opens from the cache (1.1 s of
    reading and drawing a 24 h run otherwise comes after the click)."""
    if not _WARMED.add(key):
        return
    threading.Thread(target=_refresh_ended, args=key, name="warm-whole-run",
                     daemon=True).start()


@functools.lru_cache(maxsize=16)
def _refresh_ended(db: str, run_id: int, ended_at: float, window_s: float | None,
                   gpus: bool, pick: int | None, gpu: int | None,
                   ctx: Unkeyed) -> Refresh | None:
    from monitor.store import Store

    store = Store(db)
    try:
        return _compute(_Ended(store, ctx.value), store, run_id, window_s, gpus, pick, gpu)
    finally:
        store.close()


@dataclass(frozen=True, slots=True)
class _Ended:
    """The slice of a Runtime that _compute reads, for a cached computation."""

    store: Store
    ctx: Any

    def context(self) -> Any:
        return self.ctx


def chart_figures(view: View, simulated: bool, gpu: int | None = None) -> dict:
    """The four live charts, by key (no streamlit: the bench times exactly this)."""
    steps = view.chart_steps
    source = "host timing"
    if view.seconds is None:
        timed = steps
        if analysis.device_timing(steps) is not None:  # the device's own clock (CUDA)
            timed = steps.assign(compute_s=steps["device_span_s"].fillna(steps["compute_s"]))
            source = "CUDA events"
        busy = analysis.busy_series(timed, start=view.start, end=view.end)
    else:
        busy = analysis.busy_from_seconds(view.seconds)
    bin_s = max(1.0, (view.end - view.start) / charts.MAX_POINTS)
    thr = analysis.throughput_series(steps, bin_s)
    xr = (view.start, view.end)
    util = view.gpu_util
    if gpu is not None and not util.empty:
        util = util[util["gpu"] == gpu]
    return {
        "chart_util": charts.utilization_figure(busy, util, view.events, simulated, xr,
                                                source),
        "chart_thr": charts.throughput_figure(thr, view.events, xr),
        "chart_wait": charts.wait_compute_figure(steps, view.events, xr),
        "chart_host": charts.host_figure(view.host, view.events, xr),
        "chart_phases": charts.phases_figure(steps, view.events, xr),
    }


@functools.lru_cache(maxsize=32)
def _ended(db: str, run_id: int, ended_at: float,
           ctx: Unkeyed) -> tuple[Assessment, str, str] | None:
    from monitor.store import Store

    store = Store(db)
    try:
        w = steady_window(store, run_id)
        return (assess(w, ctx.value), w.caption, w.accelerator) if w is not None else None
    finally:
        store.close()


def assessment(rt: Any, view: View) -> tuple[Assessment, str, str]:
    """(assessment, caption, accelerator kind) of what the KPI row shows: a running run's
    recent window, read each refresh; an ended run's steady state, assessed once."""
    run = view.run
    ended = run.get("ended_at")
    if run.get("status") != RUNNING and isinstance(ended, float) and not math.isnan(ended):
        done = _ended(str(rt.store.path), int(run["id"]), float(ended), Unkeyed(rt.context()))
        if done is not None:
            return done
    w = assessed_window(rt.store, view)
    return assess(w, rt.context()), w.caption, w.accelerator
