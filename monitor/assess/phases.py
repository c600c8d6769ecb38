"""A window's steps split into their phases (the probe's forward, backward and optimizer
times, monitor/probe/phases.py; the host-to-device copy where the step measures it): each
phase's share of step time, the rest of the compute as "other". Pure."""
from __future__ import annotations

from typing import Any

import pandas as pd

PHASES = ("data_wait", "copy", "forward", "backward", "optimizer", "other")
LABELS = {"data_wait": "data wait", "copy": "copy to device", "forward": "forward",
          "backward": "backward", "optimizer": "optimizer step", "other": "other"}
COLUMNS = {"copy": "copy_s", "forward": "forward_s", "backward": "backward_s",
           "optimizer": "optimizer_s"}


def per_step(steps: pd.DataFrame) -> pd.DataFrame | None:
    """Each step's phases in seconds (PHASES' columns; None: no phase was measured)."""
    have = [c for c in ("forward_s", "backward_s") if c in steps.columns]
    if steps.empty or not have or not any(steps[c].notna().any() for c in have):
        return None
    out = pd.DataFrame({"data_wait": steps["wait_s"].astype(float)}, index=steps.index)
    measured = 0.0
    for name, col in COLUMNS.items():
        out[name] = pd.to_numeric(steps[col], errors="coerce").fillna(0.0) \
            if col in steps.columns else 0.0
        measured = measured + out[name]
    out["other"] = (steps["compute_s"].astype(float) - measured).clip(lower=0.0)
    return out


def shares(steps: pd.DataFrame) -> dict[str, Any] | None:
    """{phase: share of step time, ..., "source": "host time"} over the window."""
    ph = per_step(steps)
    if ph is None:
        return None
    total = float(ph.sum().sum())
    if total <= 0:
        return None
    out: dict[str, Any] = {p: float(ph[p].sum()) / total for p in PHASES}
    out["seconds_per_step"] = {p: float(ph[p].mean()) for p in PHASES}
    out["source"] = "host time"
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
        " (host time)."
