"""What the page reads, without streamlit: the View of a window (steps, rollups, host and
GPU samples, events; long windows read from their last complete bucket on), the runs and
ranks it lists, and the notices beside them. What a refresh computes from a View is
monitor/ui/refresh.py's."""
from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from monitor.assess import outcomes
from monitor.assess.recent import READ_MARGIN_S, of_the_run
from monitor.assess.stall import STALL_KINDS, active_stall
from monitor.assess.window import (
    Window,
    recent_window,
    steady_window,
)
from monitor.frames import analysis
from monitor.store import RUNNING, Store
from monitor.thresholds import KPI_WINDOW_S
from monitor.ui import charts

RAW_WINDOW_S = 60.0  # longer chart windows read the per-second rollup


@dataclass(frozen=True, slots=True)
class View:
    """What one refresh of the live region reads from the store."""

    run: dict
    steps: pd.DataFrame
    events: pd.DataFrame
    host: pd.DataFrame
    gpu: pd.DataFrame  # per-pass GPU samples
    gpu_util: pd.DataFrame  # every NVML utilization sample
    start: float
    end: float
    seconds: pd.DataFrame | None = None  # per-second rollup, for windows over RAW_WINDOW_S

    @property
    def chart_steps(self) -> pd.DataFrame:
        """Per-step rows for the charts: the steps themselves, or each second's mean step
        from the rollup for a long window."""
        if self.seconds is None:
            return self.steps[self.steps["ts"] >= self.start]
        s = self.seconds
        n = s["steps"].clip(lower=1)
        return pd.DataFrame({"ts": s["sec"].astype(float), "wait_s": s["wait_s"] / n,
                             "compute_s": s["compute_s"] / n, "samples": s["samples"],
                             "rank": s["rank"]})


class TailCache:
    """Frames of long windows, read once up to their last complete bucket; each refresh
    reads only from there on. Keyed by store, table, run and bucket size; bounded."""

    MAX = 16

    def __init__(self) -> None:
        self._frames: dict[tuple, tuple[float, float, pd.DataFrame]] = {}
        self._lock = threading.Lock()

    def rows(self, store: Store, table: str, run_id: int, start: float, end: float,
             bucket: float) -> pd.DataFrame:
        key = (str(store.path), table, run_id, bucket)
        col = "sec" if table == "seconds" else "ts"
        with self._lock:
            from_, done_to, cached = self._frames.get(key, (math.inf, start, None))
        if cached is None or from_ > start:  # nothing kept for this stretch: read it all
            cached, done_to = None, start
        fresh = self._read(store, table, run_id, done_to, end, bucket)
        if cached is not None:
            fresh = pd.concat([cached[(cached[col] >= start) & (cached[col] < done_to)],
                               fresh], ignore_index=True)
        else:
            fresh = fresh[fresh[col] >= start]
        complete = math.floor(end / bucket) * bucket - bucket  # the last bucket may grow
        with self._lock:
            if len(self._frames) >= self.MAX and key not in self._frames:
                self._frames.pop(next(iter(self._frames)))
            self._frames[key] = (start, complete, fresh[fresh[col] < complete])
        return fresh

    @staticmethod
    def _read(store: Store, table: str, run_id: int, since: float, end: float,
              bucket: float) -> pd.DataFrame:
        if table == "seconds":
            return store.step_seconds(run_id, since, end)
        return analysis.run_rows(store.host_samples(since, end, bucket), run_id)


TAIL = TailCache()


def autostart_wanted(rt: Any, env: dict[str, str] | None = None) -> bool:
    """Whether the page starts its managed workload by itself: a dataset named at launch, or
    the demo on an empty store (a first `make run`). Never when a run is live or the store
    already holds runs: the page is then watching someone's job, and a demo would take its
    cores. $STARVATION_MONITOR_AUTOSTART=0 (`dashboard --watch`) never starts one."""
    if watch_only(env) or rt.workload_error:
        return False
    if rt.workload is not None:
        return True
    newest, live = rt.store.live_state()
    return newest is None and not live


def watch_only(env: dict[str, str] | None = None) -> bool:
    """`dashboard --watch`: the page starts no workload and shows no demo controls."""
    env = os.environ if env is None else env
    return env.get("STARVATION_MONITOR_AUTOSTART", "1") == "0"


def watching_job(run: dict | None, managed: int | None) -> bool:
    """The page shows a running job it did not start (an attached script, another
    dashboard's workload)."""
    return run is not None and run.get("status") == RUNNING and run.get("id") != managed


def follow_target(live: tuple[int, ...], managed: int | None) -> int | None:
    """The run "follow latest" shows: the newest live run, else the page's own workload."""
    return live[0] if live else managed


def run_ranks(store: Store, run_id: int) -> pd.DataFrame:
    """The run's ranks as stored (one row for a single process; the rank picker's list)."""
    return store.ranks(run_id)


def run_device(store: Store, run_id: int) -> Any:
    """The device the run's record names (the GPU panel's default pick), None if none."""
    return (store.run(run_id) or {}).get("device")


@dataclass(frozen=True, slots=True)
class Notices:
    """What the live region says over its charts, read with them: a stall while it lasts,
    else the wait for a first batch; and the outcomes of the advice applied so far."""

    stall: str | None
    waiting: str | None
    outcomes: list[dict[str, Any]]


def notices(store: Store, view: View) -> Notices:
    run_id, running = int(view.run["id"]), view.run["status"] == RUNNING
    stall = active_stall(store.events(run_id, kinds=STALL_KINDS)) if running else None
    waiting = first_batch_wait(view.run, view.steps, view.host) \
        if stall is None and store.last_step_ts(run_id) is None else None
    return Notices(stall, waiting, outcomes.of_run(store, run_id))


def record_advice(store: Store, run_id: int, label: str, asked: dict[str, Any]) -> None:
    """The settings Apply asked for, with the advice's prediction, as the run's event: the
    outcome (what they measured against it) is read back from it."""
    store.add_event(run_id, outcomes.ADVICE, label, asked)


def load_view(
    store: Store, run_id: int, window_s: float | None, now: float | None = None,
    gpus: bool = True,
) -> View | None:
    """One refresh's reads. A window up to RAW_WINDOW_S charts every step; a longer one reads
    the per-second rollup, host and GPU rows in buckets of MAX_POINTS, and only the last
    KPI_WINDOW_S of steps (for the live assessment): a day-long run costs what 5 min do."""
    run = store.run(run_id)
    if run is None:
        return None
    end = now if now is not None else time.time()
    ended = run["ended_at"]
    if run["status"] != RUNNING and isinstance(ended, float) and not math.isnan(ended):
        end = min(end, ended)
    start = max(run["started_at"], end - window_s) if window_s else run["started_at"]
    long = end - start > RAW_WINDOW_S
    # a bucket of a power-of-two seconds: complete buckets never change, so they are read
    # once and only the newest are read again (TAIL)
    bucket = 2.0 ** math.ceil(math.log2((end - start) / charts.MAX_POINTS)) if long else None
    host = TAIL.rows(store, "host", run_id, start, end, bucket) if long else \
        store.host_samples(start, end)
    host = analysis.run_rows(host, run_id)
    return View(
        run=run,
        steps=store.steps(run_id, since=(end - KPI_WINDOW_S - READ_MARGIN_S) if long
                          else start - READ_MARGIN_S,
                          until=end),
        events=store.events(run_id, since=start),
        host=host,
        gpu=store.gpu_samples(start, end, bucket) if gpus else _EMPTY_GPU[0],
        gpu_util=store.gpu_util(start, end, bucket) if gpus else _EMPTY_GPU[1],
        start=start, end=end,
        seconds=TAIL.rows(store, "seconds", run_id, start, end, 1.0) if long else None,
    )


_EMPTY_GPU = (pd.DataFrame({"ts": [], "gpu": [], "lost": []}),
              pd.DataFrame({"ts": [], "gpu": [], "util_pct": [], "source": []}))


def assessed_window(store: Store, view: View) -> Window:
    """What the KPI row and the verdict read: a running run's recent window, an ended run's
    steady state (the same window `measure` and `run --json` report)."""
    ranks = store.ranks(int(view.run["id"]))
    if view.run["status"] == RUNNING:
        return of_the_run(store, recent_window(view.run, view.steps, view.host, view.events,
                                               view.end, ranks))
    return steady_window(store, int(view.run["id"])) or recent_window(
        view.run, view.steps, view.host, view.events, view.end, ranks)


def first_batch_wait(run: dict, steps: pd.DataFrame, host: pd.DataFrame,
                     now: float | None = None) -> str | None:
    """A running run with no step yet: how long it has waited for its first batch, and since
    when its DataLoader workers run (the sampler saw them), so a hang before the first batch
    shows before any step is drawn."""
    if run.get("status") != RUNNING or not steps.empty:
        return None
    now = time.time() if now is None else now
    text = f"waiting for the first batch: {now - float(run['started_at']):.0f} s"
    if not host.empty and "workers" in host.columns:
        up = host[pd.to_numeric(host["workers"], errors="coerce") > 0]
        if not up.empty:
            text += f"; {int(up['workers'].iloc[-1])} workers started " \
                    f"{now - float(up['ts'].iloc[0]):.0f} s ago"
    return text


def job_scope(ranks: pd.DataFrame, job_tab: bool = False) -> tuple[str, str] | None:
    """For a job whose ranks span hosts: what this store holds of it, and the PromQL that
    shows the whole job (each node records its own ranks in its own store); None when every
    rank of the job is here. `job_tab`: this page has the Job tab (dashboard --prometheus),
    which shows every node's ranks."""
    if ranks is None or ranks.empty or "world_size" not in ranks.columns:
        return None
    world = int(pd.to_numeric(ranks["world_size"], errors="coerce").max() or 1)
    here = sorted(int(r) for r in ranks["rank"])
    if world <= len(here):
        return None
    nodes = pd.to_numeric(ranks.get("nodes"), errors="coerce").max() \
        if "nodes" in ranks.columns else None
    hosts = sorted({str(h) for h in ranks["hostname"].dropna()})
    job = next((str(j) for j in ranks.get("job_id", pd.Series(dtype=object)).dropna()), "")
    spread = f"{world} ranks on {int(nodes)} hosts" if nodes == nodes and nodes else \
        f"{world} ranks"
    text = (f"This job has {spread}; this store holds rank{'s' if len(here) > 1 else ''} "
            f"{', '.join(map(str, here))} ({', '.join(hosts)}). The others are recorded by "
            "their own nodes (monitor run on each, each with its own store); with "
            "--metrics-port on every node, Prometheus shows the whole job"
            + (f" (job_id {job})" if job else "")
            + (": the Job tab reads it there, every node's ranks in one table; or query it:"
               if job_tab else "; monitor dashboard --prometheus URL shows it in this "
               "page's Job tab, every node's ranks in one table; or query it:"))
    sel = f'{{job_id="{job}"}}' if job else ""
    promql = (f"sum by (job_id) (rate(starvation_samples_total{sel}[1m]))\n"
              f"sum by (node_rank, rank) (rate(starvation_data_wait_seconds_total{sel}[1m])) "
              f"/ sum by (node_rank, rank) (rate(starvation_steps_total{sel}[1m]))")
    return text, promql


def rank_view(view: View, pick: int | None) -> View:
    """The charts' view for one rank of a job (None: the job)."""
    if pick is None or "rank" not in view.steps.columns:
        return view
    sec = analysis.rank_rows(view.seconds, pick) if view.seconds is not None else None
    return dataclasses.replace(view, steps=analysis.rank_rows(view.steps, pick),
                               host=analysis.rank_rows(view.host, pick), seconds=sec)
