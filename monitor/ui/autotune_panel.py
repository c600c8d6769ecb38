"""The Live tab's Auto-tune switch for the selected running run (the page's own workload, or
an attached script): the monitor then tunes its loader by itself (monitor/tuning/live.py)
and this panel says where it stands; each move is a marker on the charts."""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from monitor.store import ATTACHED
from monitor.thresholds import MIN_STEP_GAIN
from monitor.tuning.policy import describe_settings, outcome
from monitor.ui.text import plain


def _switch(rt: Any, run_id: int, key: str) -> None:
    why = rt.autotune(run_id, bool(st.session_state[key]))
    st.session_state[f"{key}_error"] = why


def moves_table(summary: dict[str, Any]) -> pd.DataFrame:
    """One row per move: the setting tried, why, what it measured, kept or reverted."""
    return pd.DataFrame([{
        "setting": describe_settings(m["settings"]), "why": m["reason"],
        "samples/s": round(m["throughput"]), "best before": round(m["best_before"]),
        "outcome": outcome(m),
    } for m in summary.get("moves") or []])


def status_line(summary: dict[str, Any]) -> str:
    if summary.get("settled"):
        return f"Auto-tune {summary['settled']}."
    if summary.get("error"):
        return f"Auto-tune {summary['error']}."
    n = summary.get("observed") or 0
    where = f"; best so far {describe_settings(summary['final'])}" \
        if summary.get("final") else ""
    trying = f"; trying {describe_settings(summary['trying'])}" \
        if summary.get("trying") else ""
    return (f"Auto-tune is measuring each {summary.get('unit', 'stretch')}: {n} judged"
            f"{where}{trying}.")


def render_autotune(rt: Any, run: dict) -> None:
    run_id = int(run["id"])
    key = f"autotune_{run_id}"
    summary = rt.autotune_summary(run_id)
    st.session_state[key] = summary is not None  # another tab may have switched it
    managed = run.get("kind") != ATTACHED
    st.toggle("Auto-tune", key=key, on_change=_switch, args=(rt, run_id, key),
              help="the monitor tunes this run's loader by itself: it measures each "
                   + ("window of the workload" if managed else "epoch of the script")
                   + ", tries the next setting the bound model suggests, keeps it only if "
                   "it pays beyond the noise, and stops when nothing is predicted to gain "
                   f"{MIN_STEP_GAIN:.0%}. Moving a setting by hand turns it off.")
    why = st.session_state.get(f"{key}_error")
    if why:
        st.warning(plain(why))
    if summary is None:
        return
    st.caption(plain(status_line(summary)))
    table = moves_table(summary)
    if not table.empty:
        st.dataframe(table, hide_index=True, key=f"{key}_moves")
