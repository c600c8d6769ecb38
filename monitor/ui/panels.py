"""The live panels: notices, KPI row, verdict, charts (what they show comes from
monitor/ui/view.py, which reads the store)."""
from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from monitor import control
from monitor.assess import outcomes, probe_notes
from monitor.assess.devices import workload_gpu
from monitor.assess.window import Assessment
from monitor.config import (
    LIVE_SETTINGS,
    LOADER_SETTINGS,
    SETTING,
    ConfigError,
    LoaderConfig,
    prefetch_of,
)
from monitor.diagnosis import NO_DATA, evidence_rows
from monitor.diagnosis.rules import HEALTHY
from monitor.export.files import export_zip
from monitor.records import PROBE
from monitor.store import ATTACHED, FAILED, RUNNING, Store
from monitor.ui import charts
from monitor.ui.controls import setting_widget
from monitor.ui.text import plain
from monitor.ui.view import View

WINDOWS = {"30 s": 30.0, "1 min": 60.0, "5 min": 300.0, "15 min": 900.0, "whole run": None}
# advice the page can apply by moving a slider


SLIDER_PARAMS = LOADER_SETTINGS


PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def rank_pick(ranks: list[int], key: str) -> int | None:
    """The rank the charts show, for a job of several (None: the whole job)."""
    if len(ranks) < 2:
        return None
    pick = st.selectbox("Rank", ["all", *ranks], key=key,
                        format_func=lambda r: "all ranks" if r == "all" else f"rank {r}")
    return None if pick == "all" else int(pick)


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


def render_verdict(a: Assessment, changing: str | None = None) -> None:
    """The verdict banner: green when fed, grey without data, red otherwise; while a new
    verdict has not yet held (monitor/assess/recent.py steady_verdict) a caption says so. The
    headline is shown as text (it quotes nothing from users, but stays text all the same)."""
    dg = a.diagnosis
    if changing:
        st.caption(plain(changing))
    if dg.cause is None and dg.verdict == HEALTHY:
        st.success(f"healthy · {plain(dg.headline)}", icon="✅")
    elif dg.cause is None and dg.verdict == NO_DATA:
        st.info(plain(dg.headline))
    else:  # a named cause, after its family where there is one
        named = " · ".join(v for v in (dg.verdict, dg.cause) if v not in (None, NO_DATA))
        st.error(f"{named} · {plain(dg.headline)}", icon="⚠️")


def render_explain(a: Assessment,
                   on_apply: Callable[[str, Any, float | None, str | None], None] | None,
                   ) -> None:
    """The bound, the advice (with an Apply button for the first loader change), and the
    evidence numbers behind the verdict."""
    dg = a.diagnosis
    for f in a.findings:  # the causes named (monitor/diagnosis/causes.py), first
        st.warning(plain(f"{f.cause}: {f.text}"))
    if a.workers:
        st.caption("DataLoader workers in this window")
        st.table(pd.DataFrame([[w["worker"], "–" if w["pid"] is None else str(w["pid"]),
                                w["batches"], f"{w['share']:.0%}", _num(w["cpu_pct"], "%"),
                                _num(w["uss_mb"], " MB"), plain(str(w["state"]))]
                               for w in a.workers],
                              columns=["worker", "PID", "batches", "of batches", "CPU",
                                       "USS", "state"]).set_index("worker"))
    if dg.bound.get("text"):
        st.text(f"Bound: {dg.bound['text']}")
    for i, adv in enumerate(dg.advice, 1):
        st.text(f"{i}. {adv.reason}")
    first = next((x for x in dg.advice if x.param in SLIDER_PARAMS), None)
    if first is not None and on_apply is not None:
        # the values bound to the button as it was drawn: a click applies what its label
        # said, not the advice the click's own rerun computes (on a busy box the advice moved
        # between the two: "Apply: num_workers = 1" applied 2); the callback runs before the
        # rerun, so the sidebar's sliders are drawn at the new settings
        st.button(f"Apply: {first.param} = {first.value}", key="apply_advice", type="primary",
                  on_click=on_apply, args=(first.param, first.value,
                                           first.predicted_throughput, first.limit))
    with st.expander("Explain: the numbers behind the verdict"):
        rows = evidence_rows(a.features.to_dict())
        st.table(pd.DataFrame(rows, columns=["measure", "value"]).set_index("measure"))


def _num(v: float | None, unit: str) -> str:
    return "–" if v is None or v != v else f"{v:,.0f}{unit}"


def render_outcomes(rows: list[dict[str, Any]]) -> None:
    """Applied advice and autotune moves: what the model predicted, what was measured."""
    if not rows:
        return
    st.caption(outcomes.error_line(rows) or "applied advice: measuring its outcome")
    st.table(pd.DataFrame([[r["change"], r["source"], f"{r['predicted']:,.0f}",
                            "–" if r["measured"] is None else f"{r['measured']:,.0f}",
                            "–" if r["error"] is None else f"{r['error']:+.0%}"]
                           for r in rows],
                          columns=["change", "from", "predicted samples/s",
                                   "measured samples/s", "error"]))


def render_picture(figs: dict) -> None:
    """The product's main picture, full width, right under the KPIs."""
    st.plotly_chart(figs["chart_util"], key="chart_util", config=PLOT_CONFIG)


def render_other_charts(figs: dict) -> None:
    cols = st.columns(3)
    for col, key in zip(cols, ("chart_thr", "chart_wait", "chart_host"), strict=True):
        with col:
            st.plotly_chart(figs[key], key=key, config=PLOT_CONFIG)
    if figs.get("chart_phases") is not None:  # the script's steps, split into their phases
        st.plotly_chart(figs["chart_phases"], key="chart_phases", config=PLOT_CONFIG)


def render_run_status(run: dict) -> None:
    status = run["status"]
    if status == FAILED:
        first = (run["error"] or "unknown error").splitlines()[0]
        st.error(f"Run {run['id']} failed: {plain(first)}")
        with st.expander("Error details"):
            st.code(run["error"] or "", language=None)
    elif status == RUNNING and run["kind"] == ATTACHED:
        st.caption(f"Run {run['id']}: your script {plain(run['name'])} (pid {run['pid']}), "
                   "attached; compute is whatever its step does")
    elif status == RUNNING:
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


def render_ranks(a: Assessment, view: View, ranks: Any = None, devices: list | None = None,
                 ) -> None:
    """A job's ranks: data wait per step on one chart, and each rank's figures (with the
    NVML index of its CUDA device where the GPU inventory has it)."""
    st.plotly_chart(charts.rank_wait_figure(view.chart_steps, view.events,
                                            (view.start, view.end)),
                    key="chart_ranks", config=PLOT_CONFIG)
    rows = pd.DataFrame([r.to_dict() for r in a.ranks])
    if rows.empty:
        return
    rows["gpu"] = rank_gpus(ranks, devices or [], rows["rank"].tolist())
    st.dataframe(rows, hide_index=True, key="rank_table")


def rank_gpus(ranks: Any, devices: list, order: list[int]) -> list[int | None]:
    """Each rank's NVML index, from the CUDA device its probe reported (several GPUs on one
    host: CUDA and NVML number them differently)."""
    if ranks is None or ranks.empty or not devices:
        return [None] * len(order)
    by_rank = dict(zip(ranks["rank"].astype(int), ranks["device"], strict=True))
    return [workload_gpu(devices, by_rank.get(int(r))) for r in order]


def render_attached_controls(store: Store, run: dict, ranks: list[int], limit: int) -> None:
    """Loader changes for an attached script: requested through the store, applied by its
    probe at the script's next iter(loader), i.e. the next epoch; for a job, by every rank or
    by the one picked. `limit` is the worker ceiling (config.max_workers) the sidebar has."""
    cfg = run["config"] or {}
    fixed = probe_notes.retune(store.events(int(run["id"]), kinds=(PROBE,)))
    if not fixed["possible"]:  # a request would only be refused: say why instead
        st.info(plain(f"This script's loader cannot be re-tuned live: {fixed['why']}."))
        return
    with st.expander("Change the attached script's loader (applies at its next epoch)",
                     expanded=False):
        target = st.selectbox("ranks", ["all ranks", *ranks], key=f"att_rank_{run['id']}",
                              format_func=lambda r: r if isinstance(r, str) else f"rank {r}") \
            if len(ranks) > 1 else "all ranks"
        live = [SETTING[k] for k in LIVE_SETTINGS]  # a widget per live setting
        c = st.columns(len(live))
        nw = int(cfg.get("num_workers") or 0)
        asked: dict[str, Any] = {}
        for col, s in zip(c, live, strict=True):
            now = prefetch_of(cfg) if s.name == "prefetch_factor" else \
                cfg.get(s.name) if cfg.get(s.name) is not None else s.default
            asked[s.name] = setting_widget(
                col, s, s.kind(min(now, limit) if s.name == "num_workers" else now),
                high=limit, key=f"att_{s.name}_{run['id']}",
                disabled=s.worker_only and asked.get("num_workers", nw) == 0)
        st.caption("batch_size, sampler and dataset are fixed when the script builds its "
                   "DataLoader: change those in the script.")
        if st.button("Request", key=f"att_req_{run['id']}"):
            try:
                if asked["num_workers"] == 0:  # worker-only ones do not apply: their off
                    asked.update({s.name: s.off for s in live if s.worker_only})
                payload = LoaderConfig.live_request(cfg, limit, **asked)
            except ConfigError as exc:
                st.error(plain(exc))
            else:
                rank = None if target == "all ranks" else int(target)
                store.request_control(int(run["id"]), control.CONFIG,
                                      control.config_payload(payload, rank=rank))
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
