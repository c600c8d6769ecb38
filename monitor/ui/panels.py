"""The live panels: notices, KPI row, verdict, charts. Data comes from the store only."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from monitor import analysis
from monitor.analysis import Summary
from monitor.diagnosis import SLIDER_PARAMS, Diagnosis
from monitor.store import Store
from monitor.ui import charts

WINDOWS = {"30 s": 30.0, "1 min": 60.0, "5 min": 300.0, "15 min": 900.0, "whole run": None}
KPI_SECONDS = 10.0  # the KPI row reads the last 10 s, or less since the last config change
MIN_KPI_STEPS = 5
SETTLE_S = 1.0  # after a change: new workers start and fill their queues
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


def load_view(
    store: Store, run_id: int, window_s: float | None, now: float | None = None
) -> View | None:
    run = store.run(run_id)
    if run is None:
        return None
    end = now if now is not None else time.time()
    ended = run["ended_at"]
    if run["status"] != "running" and isinstance(ended, float) and not math.isnan(ended):
        end = min(end, ended)
    start = max(run["started_at"], end - window_s) if window_s else run["started_at"]
    host = store.host_samples(start, end)
    if not host.empty and (host["run_id"] == run_id).any():
        host = host[host["run_id"] == run_id]  # another collector may sample another run
    return View(
        run=run,
        steps=store.steps(run_id, since=start - 5.0, until=end),
        events=store.events(run_id, since=start),
        host=host,
        gpu=store.gpu_samples(start, end),
        gpu_util=store.gpu_util(start, end),
        start=start, end=end,
    )


def kpi_steps(view: View) -> tuple[pd.DataFrame, str]:
    """The steps the KPI row and the diagnosis read, and a caption saying which: the last
    10 s, or less when the settings changed since (skipping SETTLE_S of worker start-up)."""
    steps = view.steps[view.steps["ts"] >= view.end - KPI_SECONDS]
    cfg = view.events[view.events["kind"] == "config"]
    if not cfg.empty and len(cfg) > 1:
        since = float(cfg["ts"].iloc[-1])
        if since > view.end - KPI_SECONDS:
            after = steps[steps["ts"] - steps["wait_s"] >= since + SETTLE_S]
            if len(after) >= MIN_KPI_STEPS:
                return after, f"{view.end - since:.0f} s since the last change"
            return after.iloc[0:0], "settling after the last change"
    return steps, f"last {KPI_SECONDS:.0f} s"


def _pct(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.0%}"


def render_kpis(summary: Summary, workers_now: str, caption: str) -> None:
    c = st.columns(4)
    c[0].metric("Throughput", "–" if math.isnan(summary.throughput)
                else f"{summary.throughput:,.0f} samples/s")
    c[1].metric("Data-wait share", _pct(summary.data_wait_share),
                help="Σ data wait / Σ (data wait + compute) over the KPI window")
    c[2].metric("Device busy (mean)", _pct(summary.device_busy_mean),
                help="fraction of 50 ms bins covered by compute (step-derived)")
    c[3].metric("Workers", workers_now, help="configured num_workers / live worker processes")
    st.caption(f"KPIs over the {caption} ({summary.steps} steps).")


def render_verdict(dg: Diagnosis) -> None:
    """The verdict banner: green when fed, amber for advice, red when starving."""
    if dg.verdict == "healthy":
        st.success(f"**healthy** · {dg.headline}", icon="✅")
    elif dg.verdict == "no data":
        st.info(dg.headline)
    else:
        st.error(f"**{dg.verdict}** · {dg.headline}", icon="⚠️")


EVIDENCE = [  # (key, label, format)
    ("data_wait_share", "data-wait share", "{:.1%}"),
    ("throughput", "throughput (samples/s)", "{:,.0f}"),
    ("busy_mean", "device busy, mean", "{:.1%}"),
    ("busy_cv", "device busy, CV", "{:.2f}"),
    ("idle_gaps", "idle gaps ≥ 5 ms", "{}"),
    ("idle_gap_median_s", "idle gap, median (s)", "{:.3f}"),
    ("period_s", "sawtooth period (s)", "{:.2f}"),
    ("duty_cycle", "duty cycle", "{:.1%}"),
    ("wait_per_step_s", "data wait per step (s)", "{:.3f}"),
    ("compute_per_step_s", "compute per step (s)", "{:.3f}"),
    ("epoch_starts", "epoch starts", "{}"),
    ("epoch_stall_share", "time lost at epoch starts", "{:.1%}"),
    ("first_batch_s", "time to first batch (s)", "{:.2f}"),
    ("cpu_busy_fraction", "host CPU busy (of usable cores)", "{:.0%}"),
    ("main_cpu_cores", "main process CPU (cores)", "{:.2f}"),
    ("workers_cpu_cores", "workers CPU (cores)", "{:.2f}"),
    ("cpu_per_sample_s", "loading CPU per sample (ms)", "ms"),
    ("wall_per_sample_s", "loading wall per sample, one loader (ms)", "ms"),
    ("loading_cpu_per_wall", "loading CPU / wall", "{:.2f}"),
    ("usable_cores", "usable cores (affinity, cgroup quota)", "{}"),
    ("cpu_throttled", "cgroup periods throttled", "{:.0%}"),
    ("memory_fraction", "memory used (of budget)", "{:.0%}"),
    ("worker_rss_mb", "RSS per worker (MB)", "{:,.0f}"),
    ("worker_uss_mb", "USS per worker (MB)", "{:,.0f}"),
    ("copy_share", "host-to-device copy / compute", "{:.0%}"),
]


def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if spec == "ms":
        return f"{v * 1000:.2f}"
    return spec.format(v)


def render_explain(dg: Diagnosis, on_apply: Callable[[str, Any], None] | None) -> None:
    """The bound, the advice (with an Apply button for the first loader change), and the
    evidence numbers behind the verdict."""
    if dg.bound.get("text"):
        st.markdown(f"**Bound:** {dg.bound['text']}")
    for i, a in enumerate(dg.advice, 1):
        st.markdown(f"{i}. {a.reason}")
    first = next((a for a in dg.advice if a.param in SLIDER_PARAMS), None)
    if first is not None and on_apply is not None and st.button(
            f"Apply: {first.param} = {first.value}", key="apply_advice", type="primary"):
        on_apply(first.param, first.value)
        st.rerun()  # the whole page, so the sidebar's sliders move to the new settings
    with st.expander("Explain: the numbers behind the verdict"):
        rows = [(label, _fmt(dg.evidence.get(key), spec)) for key, label, spec in EVIDENCE]
        st.table(pd.DataFrame(rows, columns=["measure", "value"]).set_index("measure"))


def render_charts(view: View, simulated: bool, gpu: int | None = None) -> None:
    """The four live charts; `gpu`: the NVML device shown beside device busy."""
    steps = view.steps[view.steps["ts"] >= view.start]
    busy = analysis.busy_series(steps, start=view.start, end=view.end)
    bin_s = max(1.0, (view.end - view.start) / charts.MAX_POINTS)
    thr = analysis.throughput_series(steps, bin_s)
    xr = (view.start, view.end)
    util = view.gpu_util
    if gpu is not None and not util.empty:
        util = util[util["gpu"] == gpu]
    left, right = st.columns(2)
    with left:
        st.plotly_chart(charts.utilization_figure(busy, util, view.events, simulated, xr),
                        key="chart_util", config=PLOT_CONFIG)
        st.plotly_chart(charts.throughput_figure(thr, view.events, xr), key="chart_thr",
                        config=PLOT_CONFIG)
    with right:
        st.plotly_chart(charts.wait_compute_figure(steps, view.events, xr), key="chart_wait",
                        config=PLOT_CONFIG)
        st.plotly_chart(charts.host_figure(view.host, view.events, xr), key="chart_host",
                        config=PLOT_CONFIG)


def render_run_status(run: dict) -> None:
    status = run["status"]
    if status == "failed":
        first = (run["error"] or "unknown error").splitlines()[0]
        st.error(f"Run {run['id']} failed: {first}")
        with st.expander("Error details"):
            st.code(run["error"] or "", language=None)
    elif status == "running" and run["kind"] == "attached":
        st.caption(f"Run {run['id']}: your script {run['name']} (pid {run['pid']}), attached; "
                   "compute is whatever its step does")
    elif status == "running":
        st.caption(f"Run {run['id']} ({run['name']}) running on: {run['accelerator'] or '…'}")
    else:
        reason = f": {run['error']}" if isinstance(run["error"], str) and run["error"] else ""
        st.info(f"Run {run['id']} {status}{reason}. Press Start to run again.")


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


def render_attached_controls(store: Store, run: dict) -> None:
    """Loader changes for an attached script: requested through the store, applied by its
    probe at the script's next iter(loader), i.e. the next epoch."""
    cfg = run["config"] or {}
    with st.expander("Change the attached script's loader (applies at its next epoch)",
                     expanded=False):
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
            payload = {"num_workers": int(nw), "pin_memory": bool(pin),
                       "prefetch_factor": int(pf) if nw else None,
                       "persistent_workers": bool(pers) and nw > 0}
            store.request_control(int(run["id"]), "config", payload)
        reqs = store.control_requests(int(run["id"]))
        if not reqs.empty:
            reqs = reqs.assign(state=reqs["result"].fillna("waiting for the next epoch"))
            st.dataframe(reqs[["id", "payload", "state"]], hide_index=True,
                         key=f"att_table_{run['id']}")
