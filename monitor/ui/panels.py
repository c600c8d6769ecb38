"""The live panels: notices, KPI row, verdict, charts. Data comes from the store only."""
from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from monitor import analysis
from monitor.assess import Assessment, Window, assess, recent_window, steady_window
from monitor.config import ConfigError, LoaderConfig
from monitor.diagnosis import NO_DATA, SIMULATED, evidence_rows
from monitor.diagnosis.rules import HEALTHY
from monitor.diagnosis.thresholds import KPI_WINDOW_S
from monitor.export.files import export_zip
from monitor.store import Store
from monitor.ui import charts
from monitor.ui.text import plain

WINDOWS = {"30 s": 30.0, "1 min": 60.0, "5 min": 300.0, "15 min": 900.0, "whole run": None}
# advice the page can apply by moving a slider
SLIDER_PARAMS = ("num_workers", "batch_size", "prefetch_factor", "pin_memory",
                 "persistent_workers")
RAW_WINDOW_S = 60.0  # longer chart windows read the per-second rollup
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


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
        host = store.host_samples(since, end, bucket)
        return host[host["run_id"] == run_id] if not host.empty else host


TAIL = TailCache()


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
    if run["status"] != "running" and isinstance(ended, float) and not math.isnan(ended):
        end = min(end, ended)
    start = max(run["started_at"], end - window_s) if window_s else run["started_at"]
    long = end - start > RAW_WINDOW_S
    # a bucket of a power-of-two seconds: complete buckets never change, so they are read
    # once and only the newest are read again (TAIL)
    bucket = 2.0 ** math.ceil(math.log2((end - start) / charts.MAX_POINTS)) if long else None
    host = TAIL.rows(store, "host", run_id, start, end, bucket) if long else \
        store.host_samples(start, end)
    if not host.empty and (host["run_id"] == run_id).any():
        host = host[host["run_id"] == run_id]  # another collector may sample another run
    return View(
        run=run,
        steps=store.steps(run_id, since=(end - KPI_WINDOW_S - 5.0) if long else start - 5.0,
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
    if view.run["status"] == "running":
        return recent_window(view.run, view.steps, view.host, view.events, view.end, ranks)
    return steady_window(store, int(view.run["id"])) or recent_window(
        view.run, view.steps, view.host, view.events, view.end, ranks)


def rank_pick(ranks: list[int], key: str) -> int | None:
    """The rank the charts show, for a job of several (None: the whole job)."""
    if len(ranks) < 2:
        return None
    pick = st.selectbox("Rank", ["all", *ranks], key=key,
                        format_func=lambda r: "all ranks" if r == "all" else f"rank {r}")
    return None if pick == "all" else int(pick)


def rank_view(view: View, pick: int | None) -> View:
    """The charts' view for one rank of a job (None: the job)."""
    if pick is None or "rank" not in view.steps.columns:
        return view
    host = view.host[view.host["rank"] == pick] if "rank" in view.host.columns else view.host
    sec = view.seconds[view.seconds["rank"] == pick] if view.seconds is not None else None
    return dataclasses.replace(view, steps=view.steps[view.steps["rank"] == pick], host=host,
                               seconds=sec)


def _pct(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.0%}"


def render_kpis(a: Assessment, workers_now: str, caption: str) -> None:
    summary = a.summary
    c = st.columns(4)
    c[0].metric("Throughput", "–" if math.isnan(summary.throughput)
                else f"{summary.throughput:,.0f} samples/s")
    c[1].metric("Data-wait share", _pct(summary.data_wait_share),
                help="Σ data wait / Σ (data wait + compute) over the KPI window")
    c[2].metric("Device busy (mean)", _pct(summary.device_busy_mean),
                help="fraction of 50 ms bins covered by compute (step-derived)")
    c[3].metric("Workers", workers_now, help="configured num_workers / live worker processes")
    st.caption(f"KPIs over the {caption} ({summary.steps} steps).")


def render_verdict(a: Assessment) -> None:
    """The verdict banner: green when fed, grey without data, red otherwise. The headline is
    shown as text (it quotes nothing from users, but stays text all the same)."""
    dg = a.diagnosis
    if dg.verdict == HEALTHY:
        st.success(f"healthy · {plain(dg.headline)}", icon="✅")
    elif dg.verdict == NO_DATA:
        st.info(plain(dg.headline))
    else:
        st.error(f"{dg.verdict} · {plain(dg.headline)}", icon="⚠️")


def render_explain(a: Assessment, on_apply: Callable[[str, Any], None] | None) -> None:
    """The bound, the advice (with an Apply button for the first loader change), and the
    evidence numbers behind the verdict."""
    dg = a.diagnosis
    if dg.bound.get("text"):
        st.text(f"Bound: {dg.bound['text']}")
    for i, adv in enumerate(dg.advice, 1):
        st.text(f"{i}. {adv.reason}")
    first = next((x for x in dg.advice if x.param in SLIDER_PARAMS), None)
    if first is not None and on_apply is not None and st.button(
            f"Apply: {first.param} = {first.value}", key="apply_advice", type="primary"):
        on_apply(first.param, first.value)
        st.rerun()  # the whole page, so the sidebar's sliders move to the new settings
    with st.expander("Explain: the numbers behind the verdict"):
        rows = evidence_rows(a.features.to_dict())
        st.table(pd.DataFrame(rows, columns=["measure", "value"]).set_index("measure"))


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
    if run["status"] != "running" and isinstance(ended, float) and not math.isnan(ended):
        _CTX[0] = rt.context()
        return _refresh_ended(str(rt.store.path), run_id, float(ended), window_s, gpus,
                              pick, gpu)
    if now is not None:
        return _compute(rt, rt.store, run_id, window_s, gpus, pick, gpu, now)
    key = (str(rt.store.path), run_id, window_s, gpus, pick, gpu)
    with _SHARED_LOCK:
        hit = _SHARED.get(key)
        if hit is not None and time.monotonic() - hit[0] < SHARE_S:
            return hit[1]
    r = _compute(rt, rt.store, run_id, window_s, gpus, pick, gpu)
    with _SHARED_LOCK:  # other tabs refreshing within SHARE_S reuse this one
        _SHARED.clear() if len(_SHARED) > 32 else None
        _SHARED[key] = (time.monotonic(), r)
    return r


SHARE_S = 0.9  # tabs showing the same view within this long share one computation
_SHARED: dict[tuple, tuple[float, Refresh | None]] = {}
_SHARED_LOCK = threading.Lock()


def _compute(rt: Any, store: Store, run_id: int, window_s: float | None, gpus: bool,
             pick: int | None, gpu: int | None, now: float | None = None) -> Refresh | None:
    view = load_view(store, run_id, window_s, now=now, gpus=gpus)
    if view is None:
        return None
    a, caption, accel = assessment(rt, view)
    figs = chart_figures(rank_view(view, pick), accel == SIMULATED, gpu)
    return Refresh(view, a, caption, accel, figs)


@functools.lru_cache(maxsize=16)
def _refresh_ended(db: str, run_id: int, ended_at: float, window_s: float | None,
                   gpus: bool, pick: int | None, gpu: int | None) -> Refresh | None:
    from monitor.store import Store

    store = Store(db)
    try:
        return _compute(_Ended(store, _CTX[0]), store, run_id, window_s, gpus, pick, gpu)
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
    if view.seconds is None:
        busy = analysis.busy_series(steps, start=view.start, end=view.end)
    else:
        busy = analysis.busy_from_seconds(view.seconds)
    bin_s = max(1.0, (view.end - view.start) / charts.MAX_POINTS)
    thr = analysis.throughput_series(steps, bin_s)
    xr = (view.start, view.end)
    util = view.gpu_util
    if gpu is not None and not util.empty:
        util = util[util["gpu"] == gpu]
    return {
        "chart_util": charts.utilization_figure(busy, util, view.events, simulated, xr),
        "chart_thr": charts.throughput_figure(thr, view.events, xr),
        "chart_wait": charts.wait_compute_figure(steps, view.events, xr),
        "chart_host": charts.host_figure(view.host, view.events, xr),
    }


def render_picture(figs: dict) -> None:
    """The product's main picture, full width, right under the KPIs."""
    st.plotly_chart(figs["chart_util"], key="chart_util", config=PLOT_CONFIG)


def render_other_charts(figs: dict) -> None:
    cols = st.columns(3)
    for col, key in zip(cols, ("chart_thr", "chart_wait", "chart_host"), strict=True):
        with col:
            st.plotly_chart(figs[key], key=key, config=PLOT_CONFIG)


@functools.lru_cache(maxsize=32)
def _ended(db: str, run_id: int, ended_at: float) -> tuple[Assessment, str, str] | None:
    from monitor.store import Store

    store = Store(db)
    try:
        w = steady_window(store, run_id)
        return (assess(w, _CTX[0]), w.caption, w.accelerator) if w is not None else None
    finally:
        store.close()


_CTX: list = [None]  # the context of the call that fills the cache


def assessment(rt: Any, view: View) -> tuple[Assessment, str, str]:
    """(assessment, caption, accelerator kind) of what the KPI row shows: a running run's
    recent window, read each refresh; an ended run's steady state, assessed once."""
    run = view.run
    ended = run.get("ended_at")
    if run.get("status") != "running" and isinstance(ended, float) and not math.isnan(ended):
        _CTX[0] = rt.context()
        done = _ended(str(rt.store.path), int(run["id"]), float(ended))
        if done is not None:
            return done
    w = assessed_window(rt.store, view)
    return assess(w, rt.context()), w.caption, w.accelerator


def render_run_status(run: dict) -> None:
    status = run["status"]
    if status == "failed":
        first = (run["error"] or "unknown error").splitlines()[0]
        st.error(f"Run {run['id']} failed: {plain(first)}")
        with st.expander("Error details"):
            st.code(run["error"] or "", language=None)
    elif status == "running" and run["kind"] == "attached":
        st.caption(f"Run {run['id']}: your script {plain(run['name'])} (pid {run['pid']}), "
                   "attached; compute is whatever its step does")
    elif status == "running":
        st.caption(f"Run {run['id']} ({plain(run['name'])}) running on: "
                   f"{plain(run['accelerator'] or '…')}")
    else:
        reason = f": {run['error']}" if isinstance(run["error"], str) and run["error"] else ""
        st.info(f"Run {run['id']} {status}{plain(reason)}. Press Start to run again.")


def render_gpu_panel(view: View, devices: list, default: int | None) -> int | None:
    """The GPU panel: a device selector (the workload's GPU first) and NVML's readings.
    Returns the selected NVML index."""
    if not devices:
        return None
    indices = [d.index for d in devices]
    names = {d.index: f"GPU {d.index}: {d.name}" + (" (workload)" if d.index == default else "")
             for d in devices}
    if st.session_state.get("gpu_pick") not in indices:
        st.session_state["gpu_pick"] = default if default in indices else indices[0]
    pick = st.selectbox("GPU", indices, format_func=names.get, key="gpu_pick") \
        if len(indices) > 1 else indices[0]
    lost = view.gpu[(view.gpu["gpu"] == pick) & (view.gpu["lost"] == 1)] \
        if "lost" in view.gpu.columns else view.gpu.iloc[0:0]
    if not lost.empty:
        st.error(f"GPU {pick} was lost during the run (NVML: GPU is lost); the others go on.")
    st.plotly_chart(charts.gpu_figure(view.gpu, view.gpu_util, pick, view.events,
                                      (view.start, view.end)), key="chart_gpu",
                    config=PLOT_CONFIG)
    return pick


def render_ranks(a: Assessment, view: View) -> None:
    """A job's ranks: data wait per step on one chart, and each rank's figures."""
    st.plotly_chart(charts.rank_wait_figure(view.chart_steps, view.events,
                                            (view.start, view.end)),
                    key="chart_ranks", config=PLOT_CONFIG)
    rows = pd.DataFrame([r.to_dict() for r in a.ranks])
    if not rows.empty:
        st.dataframe(rows, hide_index=True, key="rank_table")


def render_attached_controls(store: Store, run: dict, ranks: list[int]) -> None:
    """Loader changes for an attached script: requested through the store, applied by its
    probe at the script's next iter(loader), i.e. the next epoch; for a job, by every rank or
    by the one picked."""
    cfg = run["config"] or {}
    with st.expander("Change the attached script's loader (applies at its next epoch)",
                     expanded=False):
        target = st.selectbox("ranks", ["all ranks", *ranks], key=f"att_rank_{run['id']}",
                              format_func=lambda r: r if isinstance(r, str) else f"rank {r}") \
            if len(ranks) > 1 else "all ranks"
        c = st.columns(4)
        nw = c[0].number_input("num_workers", 0, 64, int(cfg.get("num_workers") or 0),
                               key=f"att_nw_{run['id']}")
        pf = c[1].number_input("prefetch_factor", 1, 64, int(cfg.get("prefetch_factor") or 2),
                               key=f"att_pf_{run['id']}", disabled=nw == 0)
        pin = c[2].toggle("pin_memory", bool(cfg.get("pin_memory")), key=f"att_pin_{run['id']}")
        pers = c[3].toggle("persistent_workers", bool(cfg.get("persistent_workers")),
                           key=f"att_pers_{run['id']}", disabled=nw == 0)
        st.caption("batch_size, sampler and dataset are fixed when the script builds its "
                   "DataLoader: change those in the script.")
        if st.button("Request", key=f"att_req_{run['id']}"):
            try:
                payload = LoaderConfig.live_request(cfg, num_workers=int(nw),
                                                    prefetch_factor=int(pf), pin_memory=bool(pin),
                                                    persistent_workers=bool(pers))
            except ConfigError as exc:
                st.error(plain(exc))
            else:
                if target != "all ranks":
                    payload["rank"] = int(target)
                store.request_control(int(run["id"]), "config", payload)
        reqs = store.control_requests(int(run["id"]))
        if not reqs.empty:
            reqs = reqs.assign(state=reqs["result"].fillna("waiting for the next epoch"))
            st.dataframe(reqs[["id", "payload", "state"]], hide_index=True,
                         key=f"att_table_{run['id']}")


def render_downloads(rt: Any, run_id: int) -> None:
    """The selected run's files, built when a button is pressed (the same files as
    `python -m monitor export`)."""
    ctx = rt.context()
    c = st.columns([1, 1, 3])
    for col, fmt, label in ((c[0], "csv", "Download run (CSV, zip)"),
                            (c[1], "parquet", "Download run (Parquet, zip)")):
        col.download_button(label, data=partial(export_zip, str(rt.store.path), run_id, fmt,
                                                ctx),
                            file_name=f"run-{run_id}-{fmt}.zip", mime="application/zip",
                            key=f"download_{fmt}", on_click="ignore")
