"""The Sweep & tune tab: a grid sweep or an autotune run in the background, with progress,
live partial results, the knee, and buttons that move the live workload to the result."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from monitor.config import DEFAULT_PREFETCH, ConfigError, LoaderConfig
from monitor.manage.runtime import Runtime
from monitor.manage.session import SessionManager
from monitor.tuning.search import SWEEP_PARAMS, find_knee, grid
from monitor.ui import charts
from monitor.ui.controls import BATCH_SIZES
from monitor.ui.text import plain

PREFETCH_CHOICES = [1, 2, 4, 8, 16]


def render_sweep_controls(rt: Runtime) -> None:
    jobs, manager = rt.jobs, rt.manager
    running = jobs.running()
    cfg = manager.config
    st.caption("Each configuration runs as its own run: warm-up discarded, the steady state "
               "assessed as the Live tab does (spread over 3 parts). The live workload pauses "
               "meanwhile; the sliders are locked until the job ends.")
    c = st.columns(4)
    top = rt.max_workers
    nw = c[0].multiselect("num_workers", list(range(0, top + 1)),
                          default=list(range(0, top + 1)), key="sw_nw", disabled=running)
    pf = c[1].multiselect("prefetch_factor", PREFETCH_CHOICES, default=[DEFAULT_PREFETCH],
                          key="sw_pf", disabled=running)
    bs = c[2].multiselect("batch_size", BATCH_SIZES, default=[cfg.batch_size], key="sw_bs",
                          disabled=running)
    secs = c[3].number_input("seconds per configuration", min_value=2.0, max_value=300.0,
                             value=8.0, step=1.0, key="sw_secs", disabled=running)
    b = st.columns([1, 1, 1, 3])
    if b[0].button("Run sweep", key="sw_run", type="primary", disabled=running):
        try:
            configs = grid(cfg, {"num_workers": sorted(nw) or [cfg.num_workers],
                                 "prefetch_factor": sorted(pf) or [DEFAULT_PREFETCH],
                                 "batch_size": sorted(bs) or [cfg.batch_size]})
            jobs.start_sweep(configs, float(secs))
        except (ConfigError, ValueError, RuntimeError) as exc:
            st.error(plain(exc))
        else:
            st.rerun()
    if b[1].button("Tune", key="sw_tune", disabled=running,
                   help="adaptive search from the live settings: the bound model's "
                        "prediction, then single steps until a plateau"):
        try:
            jobs.start_tune(cfg, rt.max_workers, float(secs))
        except RuntimeError as exc:
            st.error(plain(exc))
        else:
            st.rerun()
    if b[2].button("Stop", key="sw_stop", disabled=not running):
        jobs.stop()
        st.rerun()


def _frame(results: list) -> pd.DataFrame:
    rows = []
    for r in results:
        d = r.to_dict()
        rows.append({**d.pop("config"), **d})
    cols = list(SWEEP_PARAMS) + ["throughput", "throughput_spread", "data_wait_share",
                                 "device_busy_mean", "peak_memory_mb", "verdict", "status",
                                 "reason", "run_id"]
    return pd.DataFrame(rows, columns=cols)


def render_sweep_progress(rt: Runtime) -> None:
    manager, state = rt.manager, rt.jobs.state
    if state is None:
        st.info("No sweep or tune yet in this dashboard.")
        return
    results, current, done = state.snapshot()
    label = "Sweep" if state.kind == "sweep" else "Tune"
    if state.kind == "sweep":
        st.progress(min(1.0, len(results) / max(state.total, 1)),
                    text=f"{label}: {len(results)} of {state.total} configurations"
                         + (" · done" if done else "") + f" · {state.seconds:.0f} s")
    else:
        st.progress(1.0 if done else 0.5, text=f"{label}: {len(results)} configurations tried"
                    + (" · done" if done else "") + f" · {state.seconds:.0f} s")
    if current is not None:
        st.caption(f"measuring num_workers={current.num_workers}, prefetch_factor="
                   f"{current.prefetch_factor}, batch_size={current.batch_size} "
                   f"(run {manager.run_id})")
    if state.error:
        st.error(f"{label} failed: {plain(state.error)}")
    df = _frame(results)
    if df.empty:
        return
    knee = find_knee(results)
    point = (lambda r: {"config": r.to_dict()["config"], "throughput": r.throughput}) \
        if knee else None
    series = None
    for name in ("prefetch_factor", "batch_size"):
        if df[name].nunique(dropna=True) > 1:
            series = name
            break
    st.plotly_chart(charts.sweep_figure(df, "num_workers", series,
                                        point(knee.knee) if knee else None,
                                        point(knee.best) if knee else None),
                    key="chart_sweep", config={"displaylogo": False})
    st.dataframe(df, hide_index=True, key="sweep_table")
    if knee:
        st.success(f"Knee: {plain(knee.text)}")
        if done:
            a, b = st.columns(2)
            if a.button("Apply knee to the live workload", key="sw_apply_knee",
                        type="primary"):
                manager.start(_live(manager, knee.knee.config))
                st.rerun()
            if b.button("Apply best", key="sw_apply_best"):
                manager.start(_live(manager, knee.best.config))
                st.rerun()


def _live(manager: SessionManager, cfg: LoaderConfig) -> LoaderConfig:
    """The live settings moved to a swept configuration's loader settings."""
    return manager.config.replace(**{k: getattr(cfg, k) for k in SWEEP_PARAMS})
