"""Plotly figures built from the store's frames. No streamlit here: every function takes
frames and returns a go.Figure, so they are tested without a page (DESIGN.md rule 9).

All traces are SVG `go.Scatter` (WebGL does not render in every browser we meet) with at most
MAX_POINTS points each. Config events are drawn on every chart as labelled vertical markers.
"""
from __future__ import annotations

import json
from datetime import datetime

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from monitor.analysis import downsample
from monitor.records import GpuSample, HostSample, label

MAX_POINTS = 5000
MEAN_WINDOW_S = 1.0
MAX_MARKERS = 12
COLORS = {
    "busy": "#1f77b4", "gpu": "#d62728", "wait": "#ff7f0e", "compute": "#2ca02c",
    "throughput": "#9467bd", "marker": "#555555",
}
_LOCAL_TZ = datetime.now().astimezone().tzinfo


def to_time(ts: pd.Series | list[float]) -> pd.Series:
    """Wall seconds -> local naive datetimes for the x axis."""
    s = pd.to_datetime(pd.Series(ts, dtype=float), unit="s", utc=True)
    return s.dt.tz_convert(_LOCAL_TZ).dt.tz_localize(None)


def set_x_range(fig: go.Figure, x_range: tuple[float, float] | None) -> go.Figure:
    """Every chart spans the same window, so before and after line up across charts."""
    if x_range is not None:
        lo, hi = to_time(list(x_range))
        fig.update_xaxes(range=[lo, hi])
    return fig


def _layout(fig: go.Figure, title: str, ytitle: str, height: int = 340) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 14}},
        height=height, margin={"l": 50, "r": 10, "t": 40, "b": 30},
        legend={"orientation": "h", "y": -0.15, "yanchor": "top", "x": 0.0,
                "xanchor": "left", "font": {"size": 11}},
        hovermode="x unified", uirevision="keep",
    )
    fig.update_yaxes(title_text=ytitle)
    return fig


def add_markers(fig: go.Figure, events: pd.DataFrame) -> go.Figure:
    """A dashed vertical line and a label for each config event (the newest MAX_MARKERS)."""
    if events is None or events.empty:
        return fig
    ev = events[events["kind"] == "config"].tail(MAX_MARKERS)
    xs = to_time(ev["ts"])
    for i, (x, text) in enumerate(zip(xs, ev["label"], strict=True)):
        fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper",
                      line={"color": COLORS["marker"], "width": 1, "dash": "dash"})
        fig.add_annotation(x=x, y=1.0 - 0.09 * (i % 3), xref="x", yref="paper", text=text,
                           showarrow=False, xanchor="left", yanchor="top",
                           font={"size": 10, "color": COLORS["marker"]},
                           bgcolor="rgba(255,255,255,0.75)")
    return fig


def utilization_figure(
    busy: pd.DataFrame, gpu: pd.DataFrame | None = None, events: pd.DataFrame | None = None,
    simulated: bool = True, x_range: tuple[float, float] | None = None,
) -> go.Figure:
    """The sawtooth chart: step-derived device busy (50 ms bins) and NVML utilization."""
    fig = go.Figure()
    b = downsample(busy, MAX_POINTS)
    name = "device busy, 50 ms bins" + (" (simulated accelerator)" if simulated else "")
    x = to_time(b["t"])
    fig.add_trace(go.Scatter(x=x, y=b["busy"] * 100, name=name, mode="lines",
                             line={"color": COLORS["busy"], "width": 1, "shape": "hv"},
                             opacity=0.45))
    if len(busy) > 1:  # the sawtooth's running mean: where it sits is the starvation
        bins = max(1, int(round(MEAN_WINDOW_S / max(float(busy["t"].diff().median()), 1e-9))))
        mean = busy["busy"].rolling(bins, min_periods=1).mean()
        m = downsample(pd.DataFrame({"t": busy["t"], "busy": mean}), MAX_POINTS)
        fig.add_trace(go.Scatter(x=to_time(m["t"]), y=m["busy"] * 100,
                                 name=f"device busy, {MEAN_WINDOW_S:g} s mean", mode="lines",
                                 line={"color": COLORS["busy"], "width": 2.5}))
    if gpu is not None and not gpu.empty:  # the gpu_util frame: every driver sample
        for idx, g in gpu.groupby("gpu"):
            g = downsample(g[["ts", "util_pct"]].rename(columns={"ts": "t"}), MAX_POINTS)
            fig.add_trace(go.Scatter(x=to_time(g["t"]), y=g["util_pct"],
                                     name=f"GPU {idx} utilization (NVML)", mode="lines",
                                     line={"color": COLORS["gpu"], "width": 1.5,
                                           "shape": "hv"}))
    fig.update_yaxes(range=[-2, 105], ticksuffix="%")
    add_markers(fig, events)
    set_x_range(fig, x_range)
    return _layout(fig, "Device utilization (a sawtooth = starved)", "busy")


RANK_LINES_MAX = 8  # beyond this many ranks: min/median/max band and the worst ranks by name
RANK_BIN_S = 1.0


def rank_wait_figure(steps: pd.DataFrame, events: pd.DataFrame | None = None,
                     x_range: tuple[float, float] | None = None) -> go.Figure:
    """Data wait per step, per rank, averaged per second: one line per rank up to
    RANK_LINES_MAX; beyond, the min-median-max band over ranks and the 3 worst ranks."""
    fig = go.Figure()
    if not steps.empty and "rank" in steps.columns:
        t0 = float(steps["ts"].min())
        b = ((steps["ts"] - t0) // RANK_BIN_S).astype(int)
        per = steps.assign(bin=b).groupby(["bin", "rank"])["wait_s"].mean().unstack("rank")
        x = to_time(t0 + per.index.to_numpy() * RANK_BIN_S)
        ranks = list(per.columns)
        if len(ranks) <= RANK_LINES_MAX:
            shown = ranks
        else:
            for name, q, fill in (("min", per.min(axis=1), None),
                                  ("median", per.median(axis=1), "tonexty"),
                                  ("max", per.max(axis=1), "tonexty")):
                fig.add_trace(go.Scatter(x=x, y=q * 1000, name=f"{name} over ranks",
                                         mode="lines", fill=fill, line={"width": 1}))
            shown = list(per.mean().sort_values(ascending=False).index[:3])
        for r in shown:
            fig.add_trace(go.Scatter(x=x, y=per[r] * 1000, name=f"rank {r}", mode="lines",
                                     line={"width": 2}))
    add_markers(fig, events)
    set_x_range(fig, x_range)
    return _layout(fig, "Data wait per step, by rank (1 s means)", "ms")


def wait_compute_figure(
    steps: pd.DataFrame, events: pd.DataFrame | None = None,
    x_range: tuple[float, float] | None = None,
) -> go.Figure:
    """Per step, stacked: compute (bottom) and data wait (top); their sum is the step time."""
    fig = go.Figure()
    if not steps.empty:
        s = downsample(steps[["ts", "wait_s", "compute_s"]], MAX_POINTS, "ts")
        x = to_time(s["ts"])
        fig.add_trace(go.Scatter(x=x, y=s["compute_s"] * 1000, name="compute", mode="lines",
                                 stackgroup="step", line={"color": COLORS["compute"],
                                                          "width": 0.5}))
        fig.add_trace(go.Scatter(x=x, y=s["wait_s"] * 1000, name="data wait", mode="lines",
                                 stackgroup="step", line={"color": COLORS["wait"],
                                                          "width": 0.5}))
    fig.update_yaxes(rangemode="tozero")
    add_markers(fig, events)
    set_x_range(fig, x_range)
    return _layout(fig, "Data wait vs compute per step", "ms per step")


def throughput_figure(
    thr: pd.DataFrame, events: pd.DataFrame | None = None,
    x_range: tuple[float, float] | None = None,
) -> go.Figure:
    fig = go.Figure()
    t = downsample(thr, MAX_POINTS)
    fig.add_trace(go.Scatter(x=to_time(t["t"]), y=t["throughput"], name="samples/s",
                             mode="lines", line={"color": COLORS["throughput"], "width": 1.5,
                                                 "shape": "hv"}))
    fig.update_yaxes(rangemode="tozero")
    add_markers(fig, events)
    set_x_range(fig, x_range)
    return _layout(fig, "Throughput", "samples/s")


def host_figure(
    host: pd.DataFrame, events: pd.DataFrame | None = None,
    x_range: tuple[float, float] | None = None,
) -> go.Figure:
    """Host: CPU per core; memory and /dev/shm; the workload's DataLoader workers."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("CPU per core (%)", "memory (MB)",
                                        "DataLoader workers: count, CPU (%), RSS (MB)"),
                        specs=[[{}], [{}], [{"secondary_y": True}]])
    if not host.empty:
        h = host.copy()
        cores = h["cpu_per_core"].map(lambda v: json.loads(v) if isinstance(v, str) else [])
        n = int(cores.map(len).max() or 0)
        for c in range(n):
            h[f"core{c}"] = cores.map(lambda v, c=c: v[c] if c < len(v) else None)
        cols = ["ts", "mem_used_mb", "shm_used_mb", "proc_rss_mb", "workers",
                "workers_cpu_pct", "workers_rss_mb"] + [f"core{c}" for c in range(n)]
        h = downsample(h[cols].astype(float), MAX_POINTS, "ts")
        x = to_time(h["ts"])
        for c in range(n):
            fig.add_trace(go.Scatter(x=x, y=h[f"core{c}"], name=f"core {c}", mode="lines",
                                     line={"width": 1}, legendgroup="cpu"), row=1, col=1)
        for name, row in (("mem_used_mb", 2), ("shm_used_mb", 2), ("proc_rss_mb", 2),
                          ("workers_cpu_pct", 3), ("workers_rss_mb", 3)):
            fig.add_trace(go.Scatter(x=x, y=h[name], name=label(HostSample, name),
                                     mode="lines"), row=row, col=1)
        fig.add_trace(go.Scatter(x=x, y=h["workers"], name=label(HostSample, "workers"),
                                 mode="lines", line={"shape": "hv", "dash": "dot"}),
                      row=3, col=1, secondary_y=True)
    fig.update_yaxes(range=[0, 105], row=1, col=1)
    add_markers(fig, events)
    set_x_range(fig, x_range)
    fig.update_layout(height=480, margin={"l": 50, "r": 10, "t": 40, "b": 30},
                      hovermode="x unified", uirevision="keep",
                      title={"text": "Host", "x": 0.01, "font": {"size": 14}})
    return fig


def gpu_figure(
    samples: pd.DataFrame, util: pd.DataFrame, gpu: int, events: pd.DataFrame | None = None,
    x_range: tuple[float, float] | None = None,
) -> go.Figure:
    """One GPU from NVML: utilization beside GPM SM activity/occupancy and the workload's own
    SM share; memory and PCIe; power, clock and temperature."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=(f"GPU {gpu}: utilization vs SM activity (%)",
                                        "memory (MB) and PCIe (MB/s)",
                                        "power (W), SM clock (MHz), temperature (°C)"),
                        specs=[[{}], [{"secondary_y": True}], [{"secondary_y": True}]])
    u = util[util["gpu"] == gpu] if not util.empty else util
    if not u.empty:
        u = downsample(u[["ts", "util_pct"]], MAX_POINTS, "ts")
        fig.add_trace(go.Scatter(x=to_time(u["ts"]), y=u["util_pct"], mode="lines",
                                 name="utilization (NVML)", line={"color": COLORS["gpu"]}),
                      row=1, col=1)
    s = samples[samples["gpu"] == gpu] if not samples.empty else samples
    if not s.empty:
        cols = [c for c in ("ts", "sm_active_pct", "sm_occupancy_pct", "proc_sm_pct",
                            "mem_used_mb", "pcie_rx_mbps", "pcie_tx_mbps", "power_w",
                            "sm_clock_mhz", "temp_c") if c in s.columns]
        s = downsample(s[cols].astype(float), MAX_POINTS, "ts")
        x = to_time(s["ts"])
        for name, row, secondary in (
            ("sm_active_pct", 1, False), ("sm_occupancy_pct", 1, False),
            ("proc_sm_pct", 1, False), ("mem_used_mb", 2, False), ("pcie_rx_mbps", 2, True),
            ("pcie_tx_mbps", 2, True), ("power_w", 3, False), ("temp_c", 3, False),
            ("sm_clock_mhz", 3, True),
        ):
            if name in s.columns and s[name].notna().any():
                fig.add_trace(go.Scatter(x=x, y=s[name], mode="lines",
                                         name=label(GpuSample, name)),
                              row=row, col=1, secondary_y=secondary)
    fig.update_yaxes(range=[0, 105], row=1, col=1)
    add_markers(fig, events)
    set_x_range(fig, x_range)
    fig.update_layout(height=520, margin={"l": 50, "r": 10, "t": 40, "b": 30},
                      hovermode="x unified", uirevision="keep",
                      legend={"font": {"size": 10}})
    return fig


def sweep_figure(results: pd.DataFrame, x: str = "num_workers", series: str | None = None,
                 knee: dict | None = None, best: dict | None = None) -> go.Figure:
    """Throughput (left axis) and data-wait share (right axis) against a swept setting, one
    line per value of a second setting; the knee and the best are marked."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    ok = results[results["status"] == "ok"] if not results.empty else results
    groups = [(None, ok)] if series is None or ok.empty else list(ok.groupby(series))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
    for i, (key, g) in enumerate(groups):
        g = g.sort_values(x)
        name = f"{series}={key}" if series is not None else "throughput"
        color = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=g[x], y=g["throughput"], name=f"{name}: samples/s",
                                 mode="lines+markers", line={"color": color},
                                 error_y={"type": "data", "visible": True,
                                          "array": (g["throughput_spread"].fillna(0)
                                                    * g["throughput"] / 2)}),
                      secondary_y=False)
        fig.add_trace(go.Scatter(x=g[x], y=g["data_wait_share"] * 100,
                                 name=f"{name}: data wait %", mode="lines+markers",
                                 line={"color": color, "dash": "dot"}), secondary_y=True)
    for point, label_text, symbol in ((best, "best", "star"), (knee, "knee", "diamond")):
        if point and point.get("throughput"):
            fig.add_trace(go.Scatter(x=[point["config"][x]], y=[point["throughput"]],
                                     mode="markers+text", text=[label_text],
                                     textposition="top center", name=label_text,
                                     marker={"symbol": symbol, "size": 16, "color": "#d62728"}),
                          secondary_y=False)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="data wait (%)", range=[0, 105], secondary_y=True)
    fig.update_xaxes(title_text=x, dtick=1 if x == "num_workers" else None)
    fig.update_layout(height=380, margin={"l": 50, "r": 50, "t": 40, "b": 40},
                      title={"text": "Sweep", "x": 0.01, "font": {"size": 14}},
                      legend={"font": {"size": 10}})
    return fig


def overlay_figure(series: dict[str, pd.DataFrame], title: str, ytitle: str,
                   percent: bool = False) -> go.Figure:
    """Runs overlaid on one axis, aligned at each run's start: frames of (s, value)."""
    fig = go.Figure()
    for name, df in series.items():
        d = downsample(df, MAX_POINTS, "s")
        fig.add_trace(go.Scatter(x=d["s"], y=d["value"] * (100 if percent else 1), name=name,
                                 mode="lines", line={"width": 1.5}))
    fig.update_xaxes(title_text="seconds since the run started")
    if percent:
        fig.update_yaxes(range=[-2, 105], ticksuffix="%")
    return _layout(fig, title, ytitle)


def ecdf_figure(waits: dict[str, pd.Series]) -> go.Figure:
    """The distribution of data wait per step, per run (ECDF: share of steps waiting at
    most x ms)."""
    fig = go.Figure()
    for name, w in waits.items():
        v = np.sort(w.dropna().to_numpy() * 1000)
        if len(v) > MAX_POINTS:
            v = v[np.linspace(0, len(v) - 1, MAX_POINTS).astype(int)]
        fig.add_trace(go.Scatter(x=v, y=np.arange(1, len(v) + 1) / max(len(v), 1), name=name,
                                 mode="lines", line={"shape": "hv", "width": 1.5}))
    fig.update_xaxes(title_text="data wait per step (ms)")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    return _layout(fig, "Data wait per step: share of steps at or below", "steps")
