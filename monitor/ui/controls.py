"""Sidebar controls: the loader sliders, Start and Stop. A change is applied to the running
workload at once through the session manager (which writes a control request); NOTE [no
change without a move] below."""

# NOTE [no change without a move]
# A run's settings change only in a control's callback, i.e. on a user's move. The browser sends
# every widget's value with each rerun, and a value the page set a moment before (the calibrated
# step replacing the preset's default, another tab's move) can come back as the old one, from a
# browser that had not yet drawn it or whose run was superseded before it did, for as long as it
# keeps the old widget: read as a move, it once set a run's step to 60 ms with nobody at the page
# (a 10 s "echo" window that followed it failed on a saturated CI box). So each time the page
# replaces a widget's value it draws it under a new key (`_key`: the name and a generation): the
# browser's old value belongs to a widget the page no longer draws, and a callback finds no
# widget of the current generation moved, so applies nothing, whenever the old value arrives. A
# widget whose value differs from what the page last set or applied, with no callback run, is set
# back to the run's settings (a lost move shows as the slider snapping back, and the user moves
# it again). A page watching a job it did not start shows that job's settings, not the demo's
# controls (render_watching).

from __future__ import annotations

from typing import Any

import streamlit as st

from monitor.config import (
    CUSTOM,
    LOADER_SETTINGS,
    MODEL_SIZES,
    PRESETS,
    SETTING,
    SETTINGS,
    SHOWN_SETTINGS,
    USER_STEP_TIME_MS,
    WORKER_CEILING_X,
    ConfigError,
    LoaderConfig,
    Setting,
    prefetch_of,
)
from monitor.manage.runtime import Runtime
from monitor.manage.session import SessionManager
from monitor.presets import PRESET_SPECS, calibrated_step_ms
from monitor.ui.text import plain

BATCH_SIZES = list(SETTING["batch_size"].choices)
KEYS = tuple(k for k in SHOWN_SETTINGS if k != "workload")  # the sidebar's widgets


def _key(name: str) -> str:
    """The session key of a sidebar widget: `cfg_<name>`, then `cfg_<name>@<n>` after the
    page replaced its value n times (NOTE [no change without a move])."""
    gen = (st.session_state.get("_generation") or {}).get(name, 0)
    return f"cfg_{name}@{gen}" if gen else f"cfg_{name}"


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
    seen = st.session_state.get("_widgets") or {}
    generation = st.session_state.setdefault("_generation", {})
    for k in KEYS:
        if k in seen and seen[k] != values[k]:  # a browser may still send the old one back
            generation[k] = generation.get(k, 0) + 1
        st.session_state[_key(k)] = values[k]
    st.session_state["_synced"] = config
    st.session_state["_step_synced"] = values["step_time_ms"]
    _remember_widgets()


def _remember_widgets() -> None:
    """What the widgets hold now, as this page set them or the user moved them: a value
    that differs from it at the next run came from no callback (NOTE [no change without a
    move])."""
    st.session_state["_widgets"] = {k: st.session_state.get(_key(k)) for k in KEYS}


def _drifted() -> bool:
    """A widget holds a value that neither this page set nor a callback applied."""
    seen = st.session_state.get("_widgets") or {}
    return any(_key(k) not in st.session_state or st.session_state[_key(k)] != seen.get(k)
               for k in KEYS)


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
        preset=preset, workload=workload, step_time_ms=step, model_size=s[_key("model_size")],
        **{x.name: x.kind(s[_key(x.name)]) for x in SETTINGS})


def _on_change(manager: SessionManager) -> None:
    """A widget's callback: applies the sidebar when a widget of the current generation
    moved; a callback of a widget the page has since redrawn under a new key (a browser's
    old value arriving) applies nothing."""
    if not _drifted():
        return
    try:
        cfg = _read(manager.config)
    except ConfigError as exc:
        st.session_state["config_error"] = str(exc)
        return
    st.session_state["config_error"] = None
    manager.reconfigure(cfg)
    st.session_state["_synced"] = cfg
    _remember_widgets()


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
    if st.session_state.get("_synced") != manager.config or _drifted() or (
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
    no_workers = int(st.session_state[_key("num_workers")]) == 0
    for setting in SETTINGS:  # a widget per declared setting (config.SETTINGS)
        setting_widget(sb, setting, key=_key(setting.name), high=rt.max_workers,
                       **{**args, "disabled": locked or setting.worker_only and no_workers})
    _accelerator(sb, args, simulated, locked)
    _buttons(sb, manager, locked)


def setting_widget(where: Any, setting: Setting, value: Any = None, high: int | None = None,
                   **kw: Any) -> Any:
    """The page's widget for a declared loader setting (the sidebar's and an attached run's
    controls): a switch, a slider over its choices, or a slider over its range (num_workers
    up to `high`, the machine's worker ceiling). `value`: its start where no session key
    holds one."""
    if value is not None:
        kw["value"] = value
    if setting.kind is bool:
        return where.toggle(setting.name, help=setting.help, **kw)
    if setting.choices:
        return where.select_slider(setting.name, list(setting.choices), help=setting.help, **kw)
    top, said = setting.high, setting.help
    if setting.name == "num_workers" and high is not None:
        top, said = high, (f"{said}. This machine has {max(1, high // WORKER_CEILING_X)} "
                           f"usable cores (the slider goes to {WORKER_CEILING_X}x).")
    return where.slider(setting.name, setting.low, top, help=said, **kw)


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


def render_watching(run: dict | None, watch_only: bool) -> None:
    """The sidebar of a page that watches a job it did not start (an attached script, a
    workload another dashboard runs), or of `dashboard --watch`: that run's settings as it
    recorded them, and where its live controls are; no demo sliders and no Start, which
    would act on the demo, not on the job."""
    sb = st.sidebar
    if run is None:
        sb.header("Watching")
        sb.caption("No run yet. Record a job with `starvation-monitor run -- python train.py`:"
                   " it shows here by itself.")
        return
    sb.header(plain(f"Run {run['id']}"))
    sb.caption(plain(f"{run.get('name')} · {run.get('kind')} · {run.get('status')}"))
    cfg = run.get("config") or {}
    shown = {k: cfg.get(k) for k in LOADER_SETTINGS if k in cfg}
    if "prefetch_factor" in shown and shown["prefetch_factor"] is None and \
            (cfg.get("num_workers") or 0) > 0:
        shown["prefetch_factor"] = prefetch_of(cfg)
    if shown:
        sb.text("\n".join(f"{k}: {v}" for k, v in shown.items()))
    else:
        sb.caption("Its loader settings are not recorded yet (they are read at its first "
                   "epoch).")
    if run.get("status") == "running":
        sb.caption("Where its loader allows it, changes to its live settings are requested "
                   "under the charts, and Auto-tune there tunes it; both apply at its next "
                   "epoch." if run.get("kind") == "attached" else
                   "Another dashboard runs this workload: change it there.")
    if watch_only:
        sb.caption("This page watches (`dashboard --watch`): it starts no workload of its own.")
