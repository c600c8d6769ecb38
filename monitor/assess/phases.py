"""A window's steps split into their phases (the probe's forward, backward and optimizer
times, monitor/probe/phases.py; the host-to-device copy where the step measures it): each
phase's share of step time, the rest of the compute as "other". Pure.

A step the device clock timed (device_span_s, CUDA events) has its phases in device time,
and its "other" is the rest of that device span; any other step's phases are host time, and
its "other" the rest of its compute. source() says which."""
from __future__ import annotations

from typing import Any

import pandas as pd

PHASES = ("data_wait", "copy", "forward", "backward", "optimizer", "other")
LABELS = {"data_wait": "data wait", "copy": "copy to device", "forward": "forward",
          "backward": "backward", "optimizer": "optimizer step", "other": "other"}
COLUMNS = {"copy": "copy_s", "forward": "forward_s", "backward": "backward_s",
           "optimizer": "optimizer_s"}
# whose clock a window's phases are on (source())
HOST, DEVICE, BOTH = "host time", "device time, CUDA events", "host and device time"


def per_step(steps: pd.DataFrame) -> pd.DataFrame | None:
    """Each timed step's phases in seconds (PHASES' columns; None: no phase was measured).
    The probe times one step in each 40 ms or so of a fast loop (NOTE [phase sampling] in
    monitor/probe/phases.py): the others have no phase and are left out."""
    have = [c for c in ("forward_s", "backward_s", "optimizer_s") if c in steps.columns]
    timed = steps[have].notna().any(axis=1) if have and not steps.empty else None
    if timed is None or not timed.any():
        return None
    steps = steps[timed]
    out = pd.DataFrame({"data_wait": steps["wait_s"].astype(float)}, index=steps.index)
    measured = 0.0
    for name, col in COLUMNS.items():
        out[name] = pd.to_numeric(steps[col], errors="coerce").fillna(0.0) \
            if col in steps.columns else 0.0
        measured = measured + out[name]
    compute = steps["compute_s"].astype(float)
    if "device_span_s" in steps.columns:  # a device-timed step: the rest of its device span
        compute = pd.to_numeric(steps["device_span_s"], errors="coerce").fillna(compute)
    out["other"] = (compute - measured).clip(lower=0.0)
    return out


def source(steps: pd.DataFrame) -> str:
    """Whose clock the steps' phases are on: the device's where the device clock timed
    every step with a phase, the host's where it timed none, else both."""
    have = steps[[c for c in ("forward_s", "backward_s", "optimizer_s")
                  if c in steps.columns]].notna().any(axis=1)
    if "device_span_s" not in steps.columns or not have.any():
        return HOST
    dev = steps.loc[have, "device_span_s"].notna()
    return DEVICE if dev.all() else HOST if not dev.any() else BOTH


def shares(steps: pd.DataFrame) -> dict[str, Any] | None:
    """{phase: share of step time, ..., "source": whose clock (source())} over the
    window."""
    ph = per_step(steps)
    if ph is None:
        return None
    total = float(ph.sum().sum())
    if total <= 0:
        return None
    out: dict[str, Any] = {p: float(ph[p].sum()) / total for p in PHASES}
    out["seconds_per_step"] = {p: float(ph[p].mean()) for p in PHASES}
    out["source"] = source(steps)
    return out


def sentence(sh: dict[str, Any]) -> str:
    """'The step is 49% backward (forward 29%, optimizer step 15%, other 6%).'"""
    parts = sorted(((sh[p], p) for p in PHASES if p != "data_wait" and sh[p] > 0.005),
                   reverse=True)
    if not parts:
        return ""
    (top, name), rest = parts[0], parts[1:4]
    more = ", ".join(f"{LABELS[p]} {s:.0%}" for s, p in rest)
    return f"The step is {top:.0%} {LABELS[name]}" + (f" ({more})" if more else "") + \
        f" ({sh.get('source', HOST)})."
