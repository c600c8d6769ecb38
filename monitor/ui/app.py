"""Starvation Monitor: the page layout (app.py at the top runs it; so does `starvation-monitor
dashboard`). Everything it shows comes from monitor.ui."""
from __future__ import annotations

import time

import streamlit as st

from monitor.assess.devices import workload_gpu
from monitor.assess.recent import steady_verdict
from monitor.config import LIVE_SETTINGS
from monitor.diagnosis import NO_DATA, SIMULATED
from monitor.store import ATTACHED, RUNNING
from monitor.ui import cadence, panels, refresh
from monitor.ui import view as views
from monitor.ui.autotune_panel import render_autotune
from monitor.ui.compare_panel import ask_compare_with_previous, render_compare
from monitor.ui.controls import render_controls, render_watching, shown_step_ms
from monitor.ui.demo_note import demo_note
from monitor.ui.job_panel import render_job_tab
from monitor.ui.resources import get_runtime, prometheus_arg
from monitor.ui.sweep_panel import render_sweep_controls, render_sweep_progress
from monitor.ui.text import plain

st.set_page_config(page_title="Starvation Monitor", page_icon="📉", layout="wide")
RECORD_HINT = ("Record your job with `starvation-monitor run -- python train.py`: it shows "
               "here by itself.")

rt = get_runtime()
manager = rt.manager
if views.autostart_wanted(rt):
    manager.ensure_started()  # a first make run: the demo starves visibly the moment it opens
st.session_state["_live_state"] = rt.store.live_state()  # what this run of the page saw

live_run = manager.run_id
run_info = rt.store.run(live_run) if live_run is not None else None
# the live workload's accelerator, as it recorded it (None until it has started)
simulated = (run_info or {}).get("accelerator_kind") in (SIMULATED, None)

st.title("Starvation Monitor")
st.caption("Is the GPU starved by its input pipeline? Per-step data wait and compute, live.")
if simulated and live_run is not None:
    st.caption("ℹ️ No CUDA device: the workload runs on a **simulated accelerator** that "
               "holds the device for a set time per step while the host waits, as a real "
               "`torch.cuda.synchronize()` would. Device busy is derived from step timings.")
if rt.workload_error:
    st.error(f"{plain(rt.workload_error)}\n\nFix it and restart the dashboard; the presets work "
             "meanwhile.", icon="🛑")
if rt.metrics_error:
    st.error(plain(rt.metrics_error), icon="🛑")
gpu_available, gpu_notice, devices = rt.store.gpu_inventory()
if not gpu_available:
    st.caption(f"GPU telemetry: {plain(gpu_notice)}")

prometheus = prometheus_arg()
tabs = st.tabs(["Live", "Compare", "Sweep & tune", *(["Job (Prometheus)"] if prometheus else [])])
live_tab, compare_tab, sweep_tab = tabs[:3]
top = live_tab.columns([3, 2])
window_name = top[0].segmented_control("Window", list(panels.WINDOWS), default="30 s",
                                       key="window") or "30 s"
runs = rt.store.runs(limit=30)
run_ids = runs["id"].astype(int).tolist()
labels = {int(r.id): f"run {r.id} · {r.name} · {r.status}" for r in runs.itertuples()}
live_ids = st.session_state["_live_state"][1]
# "Follow latest" (on by default) shows the newest live run: an attached job, or the page's
# own workload after a Start or a preset change.

# NOTE [the run selector while following]
# While it follows a live run the page sets the selector itself and draws it disabled, so a
# value of it that the browser sends back (its old one, from before it drew the new: a
# saturated box's browser sends it seconds later) is no move: read as one, on_change turned
# "Follow latest" off and held the page on the old job. A disabled selector cannot be moved,
# so a change of it while the page drew it locked is that echo; picking another run is
# "Follow latest" off first (the toggle says so).
following = top[0].toggle("Follow latest", value=True, key="follow_latest",
                          help="show the newest live run as it appears; turn it off to "
                               "pick another run")
target = views.follow_target(live_ids, live_run)
locked = bool(following and target in run_ids)
if locked:
    st.session_state["selected_run"] = target


def _picked() -> None:
    if not st.session_state.get("_run_locked"):  # a move, not the browser's old value
        st.session_state["follow_latest"] = False


selected = None
if run_ids:
    # The selectbox keeps its value as the label it showed; a run's label changes with its
    # status, so the current choice is set again when its label has: the widget then shows
    # the new label ("finished") instead of holding the old one ("running").
    current = st.session_state.get("selected_run")
    if current in labels and st.session_state.get("_selected_label") not in (
            None, labels[current]):
        st.session_state["selected_run"] = current
    if current in labels:
        st.session_state["_selected_label"] = labels[current]
    st.session_state["_run_locked"] = locked
    selected = top[1].selectbox(
        "Run", run_ids, index=0, format_func=labels.get, key="selected_run",
        on_change=_picked, disabled=locked,
        help="following the newest live run: turn Follow latest off to pick another"
        if locked else None)
if live_ids:
    top[1].caption(plain("live: " + ", ".join(labels.get(i, f"run {i}") for i in live_ids)))
elif not manager.is_alive():
    live_tab.info(RECORD_HINT if views.watch_only() else "No run is live. Press Start in the "
                  f"sidebar for the demo workload, or {RECORD_HINT[0].lower()}{RECORD_HINT[1:]}")


def apply_advice(param: str, value: object, predicted: float | None = None,
                 limit: str | None = None) -> None:
    """Move the live settings (and so the sliders) to the advice; its prediction is kept
    beside the settings asked for, so that the page can show what they measured."""
    before, new = manager.config, manager.config.replace(**{param: value})
    if predicted is not None and manager.run_id is not None:
        asked = {k: new.to_dict().get(k) for k in LIVE_SETTINGS}
        views.record_advice(rt.store, manager.run_id,
                            f"{param} {getattr(before, param)} → {value} (Apply)",
                            {**asked, "predicted": predicted, "limit": limit})
    manager.reconfigure(new)


def live_region(watching: bool = False) -> None:
    """The Live tab's content: the picture first (KPIs and the utilization chart), the
    verdict right under it, then advice, the other charts, ranks and the GPU panel.
    `watching`: a running job this dashboard did not start (watched()): its secondary
    charts are redrawn less often."""
    run_id = selected
    if run_id is None:
        st.info(RECORD_HINT if views.watch_only() else "No run yet: press Start in the sidebar.")
        return
    rank_rows = views.run_ranks(rt.store, run_id)
    ranks = sorted(int(r) for r in rank_rows["rank"])
    pick = panels.rank_pick(ranks, f"rank_pick_{run_id}")
    gpu_pick = st.session_state.get("gpu_pick") if devices else None
    if devices and gpu_pick is None:
        gpu_pick = workload_gpu(devices, views.run_device(rt.store, run_id))
    r = refresh.refresh(rt, run_id, panels.WINDOWS[window_name], bool(devices), pick, gpu_pick)
    if r is None:
        st.warning(f"Run {run_id} is not in the store.")
        return
    view, a, figs = r.view, r.assessment, r.figures
    if view.run["status"] == RUNNING and run_id == selected and \
            not st.session_state.get("_live_fragment"):
        st.rerun()  # it came back to life (Start): the refreshing fragment takes over
    panels.render_run_status(view.run)
    said = views.notices(rt.store, view)
    if said.stall:
        st.warning(plain(said.stall), icon="⏳")
    elif said.waiting:
        st.info(plain(said.waiting), icon="⏳")
    workers_live = view.host["workers"].dropna().iloc[-1] if (
        not view.host.empty and "workers" in view.host.columns
        and view.host["workers"].notna().any()) else None
    nw = (view.run["config"] or {}).get("num_workers")
    workers = ("–" if nw is None else f"{nw}") + (
        f" / {int(workers_live)} live" if workers_live is not None else "")
    panels.render_kpis(a, workers, r.caption)
    default_gpu = workload_gpu(devices, view.run.get("device"))
    seq = (run_id, int(view.steps["config_seq"].max()) if not view.steps.empty else -1)
    running = view.run["status"] == RUNNING
    every = cadence.live_period(view.run, view.events, time.time()) if running else None
    figs = cadence.drawn_figures(st.session_state.setdefault("_held", {}),
                                 (seq, window_name, pick, gpu_pick), figs, time.monotonic(),
                                 watching, every)
    panels.render_picture(figs)
    a, changing = steady_verdict(st.session_state.setdefault("_verdicts", {}),
                                       str(run_id), a, seq, time.monotonic())
    panels.render_verdict(a, changing)
    note = demo_note(a.features)
    if note:
        st.caption(plain(note))
    live_now = run_id == manager.run_id and manager.is_alive() and not rt.jobs.running()
    panels.render_explain(a, apply_advice if live_now else None)
    panels.render_outcomes(said.outcomes)
    if view.run["status"] == RUNNING and (live_now or view.run["kind"] == ATTACHED):
        render_autotune(rt, view.run)
    panels.render_other_charts(figs)
    if len(ranks) > 1:
        panels.render_ranks(a, view, rank_rows, devices)
    scope = views.job_scope(rank_rows, job_tab=bool(prometheus))
    if scope is not None:
        st.info(plain(scope[0]))
        st.code(scope[1], language="promql")
    if devices:
        st.subheader("GPU (NVML)")
        st.caption(plain(gpu_notice))
        panels.render_gpu_panel(view, devices, default_gpu)
    if view.run["kind"] == ATTACHED and view.run["status"] == RUNNING:
        panels.render_attached_controls(rt.store, view.run, ranks, rt.max_workers)
    young = time.time() - float(view.run.get("started_at") or 0.0) < cadence.FRESH_S
    if cadence.rerun(
            st.session_state, fragment=bool(st.session_state.get("_live_fragment")),
            running=running, watching=watching, live_every=every,
            young_without_verdict=young and a.diagnosis.verdict == NO_DATA,
            settings_moved=st.session_state.get("_synced") not in (None, manager.config),
            step_learned=manager.config.step_time_ms is None and st.session_state.get(
                "_step_synced") not in (None, shown_step_ms(manager.config, rt.store))):
        st.rerun()


@st.fragment(run_every=st.session_state.get("_live_every", cadence.FRESH_REFRESH_S))
def live() -> None:
    """The page's own running workload: refreshes once a second while it is young or just
    changed (the sliders' effect shows at once), every 2 s once steady (cadence.live_period);
    reads the store only."""
    st.session_state["_live_fragment"] = True
    live_region()


@st.fragment(run_every=st.session_state.get("_watch_every", cadence.WATCH_FIRST_S))
def watched() -> None:
    """A running job this dashboard did not start (an attached script, a workload another
    dashboard started): refreshes every WATCH_REFRESH_S, so that the browser's redraws take
    less of the cores the job runs on (bench/page_cost.py); every WATCH_FIRST_S while it is
    young and has no verdict yet."""
    st.session_state["_live_fragment"] = True
    live_region(watching=True)


@st.fragment
def still() -> None:
    """An ended run: read once (its figures cannot change)."""
    st.session_state["_live_fragment"] = False
    live_region()


@st.fragment(run_every=1.0)
def sweep_progress() -> None:
    render_sweep_progress(rt)


@st.fragment(run_every=1.0)
def discover() -> None:
    """A run that started (or ended) since this page last ran: run the page again, so the
    selector lists it and "follow latest" shows it. One small query a second."""
    if rt.store.live_state() != st.session_state.get("_live_state"):
        st.rerun()


shown_run = rt.store.run(selected) if selected is not None else None
# the demo's controls belong to the demo: a page showing a job it did not start, or one
# that only watches (`dashboard --watch`), shows that job's settings instead
watch_only = views.watch_only()
if views.watching_job(shown_run, manager.run_id) or (watch_only and not manager.is_alive()):
    render_watching(shown_run, watch_only)
else:
    render_controls(rt, simulated)
with live_tab:
    if shown_run is None or shown_run["status"] != RUNNING:
        still()
    else:
        (live if selected == manager.run_id else watched)()
    if selected is not None:
        panels.render_downloads(rt, selected)
        if st.button("Compare with the previous run", key="compare_previous"):
            ask_compare_with_previous(run_ids, selected)
    st.caption(plain(f"Store {rt.store.path}: {rt.store.size_bytes() / 1e6:,.1f} MB "
                     "(python -m monitor gc --keep-days N or --max-mb M trims it)"))
with compare_tab:
    render_compare(rt, run_ids, labels)
with sweep_tab:
    render_sweep_controls(rt)
    sweep_progress()
if prometheus:
    with tabs[3]:
        render_job_tab(prometheus)
with st.sidebar:
    discover()
