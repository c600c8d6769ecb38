"""Sidebar controls: the loader sliders, Start and Stop. A change is applied to the running
workload at once through the session manager (which writes a control request)."""
from __future__ import annotations

from typing import Any

import streamlit as st

from monitor.config import (
    CUSTOM,
    MAX_PREFETCH_FACTOR,
    MODEL_SIZES,
    PRESETS,
    SHOWN_SETTINGS,
    USER_STEP_TIME_MS,
    ConfigError,
    LoaderConfig,
    prefetch_of,
)
from monitor.manage.runtime import Runtime
from monitor.manage.session import SessionManager
from monitor.presets import PRESET_SPECS, calibrated_step_ms
from monitor.ui.text import plain

BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024]
KEYS = tuple(k for k in SHOWN_SETTINGS if k != "workload")  # the sidebar's widgets


def _key(name: str) -> str:
    return f"cfg_{name}"


def _default_step_ms(preset: str) -> float:
    spec = PRESET_SPECS.get(preset)
    return spec.step_time_ms if spec is not None else USER_STEP_TIME_MS


def shown_step_ms(config: LoaderConfig, store: Any) -> int:
    """The step the workload really runs with: the set one, a calibrated preset's measured
    one (from the store), else the preset's default."""
    if config.step_time_ms is not None:
        return int(round(config.step_time_ms))
    cost = store.calibration(f"sample_cost_s:{config.preset}")
    step = calibrated_step_ms(config.preset, cost, config.batch_size)
    return int(round(step if step is not None else _default_step_ms(config.preset)))


def _sync_from(config: LoaderConfig, store: Any) -> None:
    """Point this browser's widgets at the manager's config (another tab may have moved it)."""
    values = config.to_dict()
    values["prefetch_factor"] = prefetch_of(config)
    values["step_time_ms"] = shown_step_ms(config, store)
    if values["batch_size"] not in BATCH_SIZES:
        values["batch_size"] = min(BATCH_SIZES, key=lambda b: abs(b - config.batch_size))
    for k in KEYS:
        st.session_state[_key(k)] = values[k]
    st.session_state["_synced"] = config
    st.session_state["_step_synced"] = values["step_time_ms"]


def _read(base: LoaderConfig) -> LoaderConfig:
    """The widgets' values over `base` (which keeps settings the sidebar does not show);
    LoaderConfig normalises the worker-only ones."""
    s = st.session_state
    preset = s[_key("preset")]
    workload = s.get("_workload_spec") if preset == CUSTOM else None
    step: float | None = float(s[_key("step_time_ms")])
    if step == s.get("_step_synced"):  # not moved: keep the run's (None = calibrated) step
        step = base.step_time_ms if preset == base.preset else None
    return base.replace(
        preset=preset, workload=workload, num_workers=int(s[_key("num_workers")]),
        batch_size=int(s[_key("batch_size")]),
        prefetch_factor=int(s[_key("prefetch_factor")]),
        pin_memory=bool(s[_key("pin_memory")]),
        persistent_workers=bool(s[_key("persistent_workers")]),
        in_order=bool(s[_key("in_order")]),
        step_time_ms=step, model_size=s[_key("model_size")],
    )


def _on_change(manager: SessionManager) -> None:
    try:
        cfg = _read(manager.config)
    except ConfigError as exc:
        st.session_state["config_error"] = str(exc)
        return
    st.session_state["config_error"] = None
    manager.reconfigure(cfg)
    st.session_state["_synced"] = cfg


def _on_preset(manager: SessionManager) -> None:
    spec = PRESET_SPECS.get(st.session_state[_key("preset")])
    if spec is not None:
        st.session_state[_key("batch_size")] = spec.batch_size
        st.session_state[_key("step_time_ms")] = int(spec.step_time_ms)
        st.session_state["_step_synced"] = int(spec.step_time_ms)
    _on_change(manager)


def render_controls(rt: Runtime, simulated: bool) -> None:
    """The sidebar. `simulated`: show the step-time slider rather than the model size. While
    a sweep or tune owns the workload nothing here may move it; a user dataset named at
    launch is offered as the first "preset"."""
    manager, workload, locked = rt.manager, rt.workload, rt.jobs.running()
    st.session_state["_workload_spec"] = workload["spec"] if workload else None
    if st.session_state.get("_synced") != manager.config or (
            manager.config.step_time_ms is None
            and st.session_state.get("_step_synced") != shown_step_ms(manager.config, rt.store)):
        _sync_from(manager.config, rt.store)  # (a calibrated step becomes known after start)
    sb = st.sidebar
    sb.header("DataLoader")
    if locked:
        sb.warning("A sweep or tune is running: the controls are locked until it ends "
                   "(Stop it in the Sweep & tune tab).")
    args = {"on_change": _on_change, "args": (manager,), "disabled": locked}
    options = ([CUSTOM] if workload else []) + list(PRESETS)
    label = {CUSTOM: f"your workload: {workload['spec']}" if workload else CUSTOM}
    sb.selectbox("Workload", options, key=_key("preset"), on_change=_on_preset,
                 args=(manager,), disabled=locked, format_func=lambda p: label.get(p, p),
                 help="; ".join(f"{n}: {s.description}" for n, s in PRESET_SPECS.items()))
    if workload and st.session_state[_key("preset")] == CUSTOM:
        sb.caption(plain(f"{workload.get('kind')} {workload.get('dataset')}"
                   + (f", {workload['length']:,} samples" if workload.get("length") else "")
                   + (f"; model_step {workload['model_step']}()"
                      if workload.get("model_step") else "; device simulated")))
    nw_max = rt.max_workers
    sb.slider("num_workers", 0, nw_max, key=_key("num_workers"), **args,
              help=f"worker processes; 0 loads in the training process. This machine has "
                   f"{nw_max // 3} usable cores (slider goes to 3x).")
    sb.select_slider("batch_size", BATCH_SIZES, key=_key("batch_size"), **args)
    no_workers = int(st.session_state[_key("num_workers")]) == 0
    sb.slider("prefetch_factor", 1, MAX_PREFETCH_FACTOR, key=_key("prefetch_factor"),
              help="batches each worker loads ahead (needs num_workers >= 1)",
              **{**args, "disabled": locked or no_workers})
    sb.toggle("pin_memory", key=_key("pin_memory"), **args,
              help="page-locked host memory for faster host-to-GPU copies")
    sb.toggle("persistent_workers", key=_key("persistent_workers"),
              help="keep workers between epochs (needs num_workers >= 1)",
              **{**args, "disabled": locked or no_workers})
    sb.toggle("in_order", key=_key("in_order"),
              help="off: batches are handed over as the workers finish them, so one slow "
                   "sample does not hold the ones queued behind it (needs num_workers >= 1)",
              **{**args, "disabled": locked or no_workers})
    _accelerator(sb, args, simulated, locked)
    _buttons(sb, manager, locked)
    _reconcile(manager, locked)


STEP_SLIDER_MAX_MS = 500


def _accelerator(sb: Any, args: dict, simulated: bool, locked: bool) -> None:
    sb.header("Accelerator")
    # a calibrated step on a slow or busy machine can pass the slider's usual end
    top = max(STEP_SLIDER_MAX_MS, int(st.session_state.get(_key("step_time_ms")) or 0))
    if simulated:
        sb.slider("step time (ms, simulated)", 0, top, key=_key("step_time_ms"), **args,
                  help="how long the simulated device is busy per batch; the starving preset "
                       "calibrates it to 0.8x its measured loading time until you move this "
                       "(the run line above the charts shows the value in use)")
    else:
        sb.selectbox("model size (CUDA)", MODEL_SIZES, key=_key("model_size"), **args,
                     help="auto: a width-64 conv net repeated to take about the step time "
                          "below; small/medium/large: fixed widths, one pass per step")
        sb.slider("step time target (ms, model size auto)", 0, top, key=_key("step_time_ms"),
                  **{**args, "disabled": locked or st.session_state[_key("model_size")] != "auto"})


def _buttons(sb: Any, manager: SessionManager, locked: bool) -> None:
    if st.session_state.get("config_error"):
        sb.error(plain(st.session_state["config_error"]))
    c1, c2 = sb.columns(2)
    if c1.button("Start", type="primary", disabled=locked or manager.is_alive(), key="start"):
        try:
            manager.start(_read(manager.config))
        except ConfigError as exc:
            st.session_state["config_error"] = str(exc)
        st.rerun()
    if c2.button("Stop", disabled=locked or not manager.is_alive(), key="stop"):
        manager.stop()
        st.rerun()


def _reconcile(manager: SessionManager, locked: bool) -> None:
    """Apply widget values whose on_change never ran. A widget event that lands while a
    fragment is re-running can reach the script without its callback (seen under load); the
    next full run then carries values that differ from what this browser last synced."""
    if locked or st.session_state.get("_synced") != manager.config:
        return
    try:
        cfg = _read(manager.config)
    except ConfigError:
        return
    if cfg != manager.config:
        _on_change(manager)
