"""The Compare tab: 2-4 runs side by side (monitor/assess/compare.py): the settings that differ
first, their figures with deltas, throughput and device busy overlaid from each run's start,
and the distribution of data wait per step."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from monitor.assess.compare import CompareError, compare
from monitor.frames import analysis
from monitor.manage.runtime import Runtime
from monitor.ui import charts
from monitor.ui.compare_text import kpi_table
from monitor.ui.text import plain

PICK_KEY = "compare_runs"


def ask_compare_with_previous(run_ids: list[int], run_id: int) -> None:
    """The Live tab's one click: the run and the one before it, ready in the Compare tab."""
    older = [r for r in run_ids if r < run_id]
    if older:
        st.session_state[PICK_KEY] = [max(older), run_id]
        st.toast(f"Compare: run {max(older)} and run {run_id} are in the Compare tab.")


def _series(rt: Runtime, run_ids: list[int]) -> tuple[dict, dict, dict]:
    thr, busy, waits = {}, {}, {}
    for r in run_ids:
        steps = rt.store.steps(r)
        if steps.empty:
            continue
        start = analysis.span(steps)[0]  # each run's first step
        name = f"run {r}"
        t = analysis.throughput_series(steps, 1.0)
        thr[name] = pd.DataFrame({"s": t["t"] - start, "value": t["throughput"]})
        b = analysis.busy_series(steps, bin_s=1.0)
        busy[name] = pd.DataFrame({"s": b["t"] - start, "value": b["busy"]})
        waits[name] = steps["wait_s"]
    return thr, busy, waits


def render_compare(rt: Runtime, run_ids: list[int], labels: dict[int, str]) -> None:
    picked = st.multiselect("Runs to compare (2 to 4; the first is the baseline)", run_ids,
                            max_selections=4, format_func=labels.get, key=PICK_KEY)
    if len(picked) < 2:
        st.info("Pick two to four runs, or press \"Compare with the previous run\" in the "
                "Live tab.")
        return
    try:
        out = compare(rt.store, [str(r) for r in picked], rt.context())
    except CompareError as exc:
        st.error(plain(exc))
        return
    diff = pd.DataFrame({f"run {r}": pd.Series([str(out["settings_diff"][k][i]) for k in
                                                out["settings_diff"]], dtype=object)
                         for i, r in enumerate(picked)})
    diff.index = list(out["settings_diff"])
    st.subheader("What differs")
    st.dataframe(diff, key="compare_diff") if not diff.empty else \
        st.caption("Their loader settings are the same.")
    st.caption(plain("Same in all: " + ", ".join(
        f"{k}={v}" for k, v in out["settings_same"].items())))
    st.subheader("Figures (steady state of each run's final settings)")
    st.dataframe(kpi_table(out, picked), key="compare_kpis")
    gate = out["gate"]
    show = {"regression": st.error, "inconclusive": st.warning}.get(gate.get("state"),
                                                                    st.success)
    show(plain(gate["text"]))
    thr, busy, waits = _series(rt, picked)
    left, right = st.columns(2)
    left.plotly_chart(charts.overlay_figure(thr, "Throughput, aligned at each run's start",
                                            "samples/s"), key="compare_thr")
    right.plotly_chart(charts.overlay_figure(busy, "Device busy, 1 s means", "busy",
                                             percent=True), key="compare_busy")
    st.plotly_chart(charts.ecdf_figure(waits), key="compare_ecdf")
