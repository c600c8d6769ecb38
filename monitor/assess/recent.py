"""The recent window of a running run, read in one place, and the verdict held over it.

- `read_recent`: a run's rows for its live window, read once (steps and host rows from
  KPI_WINDOW_S + READ_MARGIN_S before `end`, its events and ranks); `Recent.window(rank)` cuts
  one rank (analysis.rank_rows, the one rank cut) or the job, through window.recent_window,
  with the run's history. The terminal view, the exporter and the live tuner read it so;
  the page cuts its own refresh's frames with the same recent_window and margin.
- `steady_verdict`: hysteresis. A new verdict replaces the shown one once it has held for
  HOLD_S (a whole KPI window); a settings change or a first verdict shows at once, and
  "no data" never replaces a verdict. The page's banner and the exporter's verdict go
  through it, so one moment shows one verdict.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from monitor.assess import same_runs
from monitor.assess.devices import window_gpu_util
from monitor.assess.window import Assessment, Window, recent_window, run_history
from monitor.diagnosis import NO_DATA
from monitor.frames import analysis
from monitor.frames.analysis import rank_rows, run_rows
from monitor.thresholds import KPI_WINDOW_S

if TYPE_CHECKING:
    from monitor.store import Store

READ_MARGIN_S = 5.0  # read before the window: a step stored at ts began up to its wait before
HOLD_S = KPI_WINDOW_S  # a new verdict shows once it has held for a whole KPI window


@dataclass(frozen=True, slots=True)
class Recent:
    """One run's rows for its live window, read once; cut per rank by `window`."""

    store: Store
    run: dict[str, Any]
    steps: pd.DataFrame
    host: pd.DataFrame
    events: pd.DataFrame
    ranks: pd.DataFrame
    end: float
    same: tuple[dict[str, Any], ...] = ()  # earlier identical runs' ends, read once a run

    def window(self, rank: int | None = None) -> Window:
        """The live window of one rank (None: the whole job), with the run's history."""
        steps, host = self.steps, self.host
        if rank is not None:
            steps, host = rank_rows(steps, rank), rank_rows(host, rank)
        w = recent_window(self.run, steps, host, self.events, self.end, self.ranks)
        util = window_gpu_util(self.store, self.run, *analysis.span(w.steps)) \
            if not w.steps.empty else None
        return dataclasses.replace(of_the_run(self.store, w, self.events, self.same),
                                   gpu_util=util)


def of_the_run(store: Store, w: Window, events: pd.DataFrame | None = None,
               same: tuple[dict[str, Any], ...] | None = None) -> Window:
    """A live window with what the store holds of its run: its ended generations, and the
    ends of earlier identical runs (`same`, where the caller read them already), so that a
    live window by the line is judged as its final verdict will be (NOTE [identical
    runs])."""
    return dataclasses.replace(
        w, history=run_history(store, int(w.run["id"]), w.steps, events),
        same_runs=same if same is not None else same_runs.earlier(store, w.run))


def read_recent(store: Store, run_id: int, end: float) -> Recent | None:
    """The run's rows for its live window ending at `end`; None when there is no such run."""
    run = store.run(run_id)
    if run is None:
        return None
    since = end - KPI_WINDOW_S - READ_MARGIN_S
    return Recent(store, run, store.steps(run_id, since=since, until=end),
                  run_rows(store.host_samples(since, end), run_id), store.events(run_id),
                  store.ranks(run_id), end, same_runs.earlier(store, run))


def steady_verdict(state: dict[str, Any], key: Any, a: Assessment, seq: Any,
                   now: float) -> tuple[Assessment, str | None]:
    """The assessment to show, and "changing: A → B" while a new verdict has not yet held
    for HOLD_S (hysteresis: a verdict that flips with each refresh's window stays put). A
    settings change (`seq`) or a first verdict shows at once; "no data" never replaces a
    verdict. `state` is the caller's own (a page session's, the exporter's)."""
    s = state.get(key)
    if s is None or s["seq"] != seq or s["shown"].verdict == NO_DATA:
        state[key] = {"shown": a, "seq": seq, "cand": None, "since": now}
        return a, None
    shown = s["shown"]
    new, old = a.diagnosis.named, shown.diagnosis.named  # a named cause is the verdict
    if new == old:
        s.update(shown=a, cand=None)
        return a, None
    if a.verdict == NO_DATA:
        return shown, None
    if s["cand"] != new:
        s.update(cand=new, since=now)
    if now - s["since"] >= HOLD_S:
        s.update(shown=a, cand=None)
        return a, None
    return shown, f"changing: {old} → {new}"
