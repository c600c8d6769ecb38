"""Figures are built without Streamlit: SVG traces, point caps, config markers."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from monitor.frames.analysis import busy_series
from monitor.ui import charts
from tests.test_analysis import steps_frame


def events_frame():
    return pd.DataFrame({"ts": [1000.0, 1002.0], "kind": ["config", "config"],
                         "label": ["start", "num_workers 0→2"]})


def _all_scatter_svg(fig: go.Figure) -> bool:
    return all(t.type == "scatter" for t in fig.data)


def test_utilization_figure_has_busy_and_nvml_traces_and_markers():
    steps = steps_frame([0.1] * 30, [0.05] * 30)
    gpu = pd.DataFrame({"ts": [1000.0, 1000.5, 1001.0], "gpu": [0, 0, 0],
                        "util_pct": [10.0, 90.0, 20.0]})
    fig = charts.utilization_figure(busy_series(steps), gpu, events_frame(), simulated=False)
    names = [t.name for t in fig.data]
    assert names[0].startswith("device busy, 50 ms bins") and "GPU 0 utilization (NVML)" in names
    assert "device busy, 1 s mean" in names
    assert _all_scatter_svg(fig)
    labels = [a.text for a in fig.layout.annotations]
    assert "num_workers 0→2" in labels and len(fig.layout.shapes) == 2


def test_point_cap_per_trace():
    n = 20000
    busy = pd.DataFrame({"t": 1000 + np.arange(n) * 0.05, "busy": np.tile([0.0, 1.0], n // 2)})
    fig = charts.utilization_figure(busy)
    assert all(len(t.x) <= charts.MAX_POINTS for t in fig.data)
    steps = steps_frame([0.01] * n, [0.01] * n)
    fig = charts.wait_compute_figure(steps)
    assert all(len(t.x) <= charts.MAX_POINTS for t in fig.data)


def test_wait_compute_is_stacked_in_ms():
    steps = steps_frame([0.1] * 5, [0.05] * 5)
    fig = charts.wait_compute_figure(steps, events_frame())
    by = {t.name: t for t in fig.data}
    assert by["data wait"].stackgroup == by["compute"].stackgroup
    assert list(by["data wait"].y) == [100.0] * 5 and list(by["compute"].y) == [50.0] * 5


def test_host_figure_per_core_and_workers():
    host = pd.DataFrame({
        "ts": [1000.0, 1001.0], "cpu_per_core": [json.dumps([10, 90]), json.dumps([20, 80])],
        "mem_used_mb": [1.0, 2.0], "shm_used_mb": [0.0, 5.0], "proc_rss_mb": [100.0, 100.0],
        "workers": [0, 2], "workers_cpu_pct": [0.0, 150.0], "workers_rss_mb": [0.0, 300.0],
    })
    fig = charts.host_figure(host, events_frame())
    names = [t.name for t in fig.data]
    assert {"core 0", "core 1", "DataLoader workers", "workers CPU (%)",
            "workers RSS (MB)", "/dev/shm used (MB)"} <= set(names)
    assert _all_scatter_svg(fig)


def test_a_many_core_host_draws_its_busiest_median_and_idlest_core():
    """192 cores (a GPU node's CPU): three lines, not 192 lines and a 192-entry legend; the
    busiest core at each sample is the most loaded one then, whichever it is; a sample with
    no reading is a gap. Eight cores or fewer keep a line each."""
    rows = [[float(c % 7) for c in range(192)] for _ in range(3)]
    rows[1][150] = 100.0  # one core pinned (a GIL-bound main process) among idle ones
    host = pd.DataFrame({"ts": [1000.0, 1001.0, 1002.0, 1003.0],
                         "cpu_per_core": [json.dumps(r) for r in rows] + [None],
                         "mem_used_mb": [1.0] * 4})
    fig = charts.host_figure(host)
    cpu = {t.name: list(t.y) for t in fig.data if t.legendgroup == "cpu"}
    assert set(cpu) == {"busiest core", "median core", "idlest core"}, sorted(cpu)[:5]
    assert cpu["busiest core"][:3] == [6.0, 100.0, 6.0] and cpu["idlest core"][:3] == [0.0] * 3
    assert cpu["median core"][0] == float(np.median(rows[0]))
    assert all(v != v for v in (cpu[k][3] for k in cpu))  # NaN: the sample without one
    assert any(a.text.startswith("CPU of 192 cores") for a in fig.layout.annotations)
    assert len(fig.to_json()) < 30_000
    eight = host.assign(cpu_per_core=[json.dumps(r[:8]) for r in rows] + [None])
    assert {t.name for t in charts.host_figure(eight).data if t.legendgroup == "cpu"} == \
        {f"core {c}" for c in range(8)}


def test_a_many_core_store_spanning_the_stored_figures_draws_each_row_once_in_buckets(tmp_path):
    """A store whose first rows predate the three stored core figures (drawn from their
    readings) and whose later rows carry them, read in buckets as a long window is: a
    bucket's line is the mean of its samples' busiest (median, idlest) core, a core pinned
    in one sample included (a bucket keeps one reading of 192, not the one with it)."""
    from monitor.records import HostSample
    from monitor.store import Store

    def row(ts: float, pinned: int | None, figures: bool) -> HostSample:
        cores = [6.0] * 191 + [2.0]
        if pinned is not None:
            cores[pinned] = 100.0
        stats = dict(cpu_busiest_core_pct=max(cores), cpu_median_core_pct=6.0,
                     cpu_idlest_core_pct=2.0) if figures else {}
        return HostSample(ts=ts, run_id=1, cpu_total_pct=sum(cores) / 192,
                          cpu_per_core=json.dumps(cores), mem_used_mb=1.0, mem_total_mb=2.0,
                          mem_available_mb=1.0, shm_used_mb=0.0, proc_cpu_pct=None,
                          proc_rss_mb=None, workers=0, workers_cpu_pct=None,
                          workers_rss_mb=None, **stats)

    store = Store(tmp_path / "s.db")
    try:  # two buckets of four samples; in the later, one sample has a core pinned
        store.insert([row(1000.0 + k, None, figures=False) for k in range(4)])
        store.insert([row(1004.0 + k, (None, None, 3, None)[k], figures=True)
                      for k in range(4)])
        host = store.host_samples(999.0, 1010.0, bucket_s=4.0)
    finally:
        store.close()
    cpu = {t.name: list(t.y) for t in charts.host_figure(host).data
           if t.legendgroup == "cpu"}
    assert cpu["busiest core"] == [6.0, 29.5], cpu  # (6 + 6 + 100 + 6) / 4 in the later
    assert cpu["median core"] == [6.0, 6.0] and cpu["idlest core"] == [2.0, 2.0]


def test_empty_frames_still_draw():
    empty = pd.DataFrame(columns=["ts", "wait_s", "compute_s", "samples"])
    assert isinstance(charts.wait_compute_figure(empty), go.Figure)
    assert isinstance(charts.utilization_figure(busy_series(empty)), go.Figure)
    assert isinstance(charts.host_figure(pd.DataFrame()), go.Figure)


def test_gpu_figure_shows_util_beside_sm_activity_and_process_share():
    from monitor.records import GpuSample
    from monitor.sampling.gpu.nvml import _blank

    util = pd.DataFrame({"ts": [1000.0, 1000.2, 1000.4], "gpu": [0, 0, 1],
                         "util_pct": [100.0, 100.0, 5.0]})
    rows = [GpuSample(**{**_blank(1000.0 + i * 0.25, 0), "sm_active_pct": 30.0,
                         "proc_sm_pct": 25.0, "power_w": 300.0}) for i in range(3)]
    samples = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    fig = charts.gpu_figure(samples, util, 0, events_frame(), (999.0, 1002.0))
    names = [t.name for t in fig.data]
    assert "utilization (NVML)" in names and "SM activity (GPM) (%)" in names
    assert "workload SM utilization (NVML, per process) (%)" in names
    assert "power (W)" in names and "temperature (°C)" not in names  # all missing: no trace
    util_trace = next(t for t in fig.data if t.name == "utilization (NVML)")
    assert list(util_trace.y) == [100.0, 100.0]  # only GPU 0
    assert _all_scatter_svg(fig)


def test_a_watched_jobs_secondary_charts_are_held_and_redrawn_on_time():
    """The main picture is new at every refresh; the secondary charts are sent again as
    drawn (no redraw in the browser) until they are SECONDARY_HOLD_S old or the view
    changes (a settings change, another window or rank)."""
    from monitor.ui.cadence import SECONDARY_CHARTS, SECONDARY_HOLD_S, held_figures

    def figs(n: int) -> dict:
        return {k: f"{k}@{n}" for k in ("chart_util", *SECONDARY_CHARTS)}

    state: dict = {}
    assert held_figures(state, "seq1", figs(0), 100.0) == figs(0)
    later = held_figures(state, "seq1", figs(1), 100.0 + SECONDARY_HOLD_S - 0.1)
    assert later["chart_util"] == "chart_util@1"  # the picture is always new
    assert all(later[k] == f"{k}@0" for k in SECONDARY_CHARTS)
    assert held_figures(state, "seq1", figs(2), 100.0 + SECONDARY_HOLD_S) == figs(2)
    assert held_figures(state, "seq2", figs(3), 100.0 + SECONDARY_HOLD_S + 0.1) == figs(3)


def test_the_pages_own_run_redraws_its_secondary_charts_every_other_refresh_then_holds():
    """The page's own young (or just changed) run redraws its secondary charts at every
    other refresh; once steady they are held as a watched job's are; a change of settings
    redraws every chart at once, young or steady (the browser's CPU: ui/cadence.py); an
    ended run's view is drawn whole."""
    from monitor.ui.cadence import (
        FRESH_HOLD_S,
        FRESH_REFRESH_S,
        SECONDARY_CHARTS,
        SECONDARY_HOLD_S,
        STEADY_REFRESH_S,
        drawn_figures,
    )

    def figs(n: int) -> dict:
        return {k: f"{k}@{n}" for k in ("chart_util", *SECONDARY_CHARTS)}

    assert FRESH_REFRESH_S < FRESH_HOLD_S < 2 * FRESH_REFRESH_S  # every other refresh
    assert SECONDARY_HOLD_S == 3 * STEADY_REFRESH_S  # every third, as the cases below read
    # (watching, the period, seconds between refreshes, the refreshes that redraw them)
    cases = ((False, FRESH_REFRESH_S, FRESH_REFRESH_S, [0, 2, 4, 6]),
             (False, STEADY_REFRESH_S, STEADY_REFRESH_S, [0, 3, 6]),
             (True, STEADY_REFRESH_S, 2.0, [0, 3, 6]), (True, FRESH_REFRESH_S, 2.0, [0, 3, 6]),
             (False, None, 1.0, list(range(8))))  # an ended run: drawn whole, once
    for watching, period, every, redrawn in cases:
        state: dict = {}
        drawn = [drawn_figures(state, "seq1", figs(i), 100.0 + i * every, watching, period)
                 for i in range(8)]
        assert all(d["chart_util"] == f"chart_util@{i}" for i, d in enumerate(drawn))
        for k in SECONDARY_CHARTS:
            assert [i for i, d in enumerate(drawn) if d[k] == f"{k}@{i}"] == redrawn, \
                (watching, period, k)
        # a change of settings (a new key) draws every chart at once
        assert drawn_figures(state, "seq2", figs(9), 100.0 + 8 * every + 0.1, watching,
                             period) == figs(9)
    # the run ends a moment after a live refresh: its still view holds nothing back
    state = {}
    drawn_figures(state, "seq1", figs(0), 100.0, False, STEADY_REFRESH_S)
    assert drawn_figures(state, "seq1", figs(1), 100.5, False, None) == figs(1)


def test_the_host_charts_time_axis_sits_under_its_bottom_panel():
    """The three host panels share one time axis; drawn under the top panel (plotly's
    default anchor) its date labels fell on the memory panel's title (the HTML report)."""
    import pandas as pd

    from monitor.ui import charts

    host = pd.DataFrame({"ts": [1.0e9, 1.0e9 + 1], "cpu_per_core": [[10.0, 20.0]] * 2,
                         "mem_used_mb": [100.0, 110.0]})
    lay = charts.host_figure(host).layout
    anchor = lay.xaxis.anchor
    domain = lay[anchor.replace("y", "yaxis")].domain
    assert domain[0] == 0.0, (anchor, domain)
    titles = [a.y for a in lay.annotations if a.text in ("memory (MB)", "CPU per core (%)")]
    assert all(y > domain[1] for y in titles)


def test_every_live_chart_is_a_valid_plotly_figure():
    """The live charts are built without plotly's validation (charts.figure): here each one,
    with markers and every trace kind it draws, passes it, so a wrong property name or value
    fails this test instead of reaching a page."""
    import plotly.exceptions

    steps = steps_frame([0.1] * 30, [0.05] * 30).assign(rank=[0, 1] * 15)
    gpu = pd.DataFrame({"ts": [1000.0, 1001.0], "gpu": [0, 0], "util_pct": [10.0, 90.0]})
    host = pd.DataFrame({
        "ts": [1000.0, 1001.0], "cpu_per_core": [json.dumps([10, 90]), json.dumps([20, 80])],
        "mem_used_mb": [1.0, 2.0], "shm_used_mb": [0.0, 5.0], "proc_rss_mb": [100.0, 100.0],
        "workers": [0, 2], "workers_cpu_pct": [0.0, 150.0], "workers_rss_mb": [0.0, 300.0]})
    rollup = pd.DataFrame({"t": [1000.0, 1001.0], "busy": [0.5, 0.6], "busy_max": [1.0, 1.0],
                           "busy_min": [0.0, 0.1]})
    thr = pd.DataFrame({"t": [1000.0, 1001.0], "throughput": [10.0, 12.0]})
    ev = events_frame()
    figs = [charts.utilization_figure(busy_series(steps), gpu, ev, simulated=False),
            charts.utilization_figure(rollup, None, ev), charts.rank_wait_figure(steps, ev),
            charts.wait_compute_figure(steps, ev, (1000.0, 1005.0)),
            charts.throughput_figure(thr, ev), charts.host_figure(host, ev)]
    for fig in figs:
        try:
            checked = go.Figure(fig.to_dict())  # plotly's own validation of every property
        except (ValueError, plotly.exceptions.PlotlyError) as exc:
            raise AssertionError(f"{fig.layout.title.text}: {exc}") from None
        assert len(checked.data) == len(fig.data) and checked.data
    bad = charts.figure([charts.line([1], [2], "x", colour="red")], {})
    try:
        go.Figure(bad.to_dict())
    except ValueError as exc:
        assert "colour" in str(exc)
    else:
        raise AssertionError("an invalid property passed the check")


def test_the_live_page_refreshes_fast_while_young_or_just_changed_then_slower():
    from monitor.ui.cadence import FRESH_REFRESH_S, FRESH_S, STEADY_REFRESH_S, live_period

    run = {"started_at": 1000.0}
    none = pd.DataFrame(columns=["ts", "kind", "label"])
    assert live_period(run, none, 1000.0 + FRESH_S - 1) == FRESH_REFRESH_S
    assert live_period(run, none, 1000.0 + FRESH_S + 1) == STEADY_REFRESH_S
    ev = pd.DataFrame({"ts": [1001.0, 1100.0, 1150.0], "kind": ["config", "config", "stalled"],
                       "label": ["start", "num_workers 0 → 2", "a stall"]})
    assert live_period(run, ev, 1100.0 + FRESH_S - 1) == FRESH_REFRESH_S  # a change
    assert live_period(run, ev, 1150.0 + 1) == STEADY_REFRESH_S  # not a settings change
    assert STEADY_REFRESH_S > FRESH_REFRESH_S


def test_the_phase_chart_draws_the_timed_steps_and_says_how_many_were_timed():
    """NOTE [phase sampling]: one step in ten has phases here; the chart draws those and its
    title says so; where every step is timed the title says nothing of it."""
    steps = steps_frame([0.002] * 100, [0.010] * 100)
    for col, v in (("forward_s", 0.002), ("backward_s", 0.005), ("optimizer_s", 0.001)):
        steps[col] = [v if i % 10 == 0 else None for i in range(100)]
    fig = charts.phases_figure(steps)
    assert fig.layout.title.text.endswith("; 1 step in 10 timed)"), fig.layout.title.text
    assert {len(t.x) for t in fig.data} == {10}
    every = steps.assign(forward_s=0.002, backward_s=0.005, optimizer_s=0.001)
    assert charts.phases_figure(every).layout.title.text == "Where each step goes (host time)"


def test_the_pages_rerun_rules_say_why_and_set_the_fragments_periods():
    from monitor.ui import cadence

    base = dict(fragment=True, running=True, watching=False, live_every=cadence.FRESH_REFRESH_S,
                young_without_verdict=False, settings_moved=False, step_learned=False)
    state: dict = {}
    assert cadence.rerun(state, **base) is None and state["_live_every"] == 1.0
    assert "ended" in cadence.rerun(state, **{**base, "running": False})
    # a steady run: the live fragment's period changes once, then holds
    assert "new period" in cadence.rerun(state, **{**base, "live_every": 2.0})
    assert state["_live_every"] == 2.0 and cadence.rerun(state, **{**base, "live_every": 2.0}) \
        is None
    # a watched job: fast while young without a verdict, then the steady period
    w = {**base, "watching": True, "live_every": None}
    assert cadence.rerun(state, **{**w, "young_without_verdict": True}) is None
    assert "watched fragment" in cadence.rerun(state, **w)
    assert state["_watch_every"] == cadence.WATCH_REFRESH_S
    # outside a fragment: only the sidebar's reasons
    still = {**base, "fragment": False, "running": False}
    assert cadence.rerun({}, **still) is None
    assert "sidebar follows" in cadence.rerun({}, **{**still, "settings_moved": True})
    assert "calibrated step" in cadence.rerun({}, **{**still, "step_learned": True})
