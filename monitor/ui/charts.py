"""Plotly figures built from the store's frames. No streamlit here: every function takes
frames and returns a go.Figure, so they are tested without a page (DESIGN.md rule 9).

All traces are SVG `go.Scatter` (WebGL does not render in every browser we meet) with at most
MAX_POINTS points each. Config events are drawn on every chart as labelled vertical markers.
"""
from __future__ import annotations

import json
import warnings
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from monitor import control
from monitor.frames.analysis import downsample
from monitor.records import GpuSample, HostSample, label

MAX_POINTS = 1200  # per trace: about a point per pixel of a wide chart
MEAN_WINDOW_S = 1.0
MAX_MARKERS = 12
COLORS = {
    "busy": "#1f77b4", "gpu": "#d62728", "wait": "#ff7f0e", "compute": "#2ca02c",
    "throughput": "#9467bd", "marker": "#555555", "autotune": "#8c1aa3",
}
_LOCAL_TZ = datetime.now().astimezone().tzinfo
_UTC_OFFSET_S = (datetime.now(_LOCAL_TZ).utcoffset() or timedelta(0)).total_seconds()


def to_time(ts: pd.Series | list[float]) -> pd.Series:
    """Wall seconds -> local naive datetimes for the x axis."""
    s = pd.to_datetime(pd.Series(ts, dtype=float), unit="s", utc=True)
    return s.dt.tz_convert(_LOCAL_TZ).dt.tz_localize(None)


def x_ms(ts: Any) -> np.ndarray:
    """Wall seconds -> local milliseconds, which a date axis reads as local times: numbers
    are faster to build and smaller to send than date strings (numpy arrays: plotly checks
    them whole, not element by element)."""
    return np.round((np.asarray(ts, dtype=float) + _UTC_OFFSET_S) * 1000.0, 1)


def y_list(v: Any, scale: float = 1.0) -> np.ndarray:
    """Values as float32: half the bytes on the wire, and more precision than a chart shows."""
    return (np.asarray(v, dtype=float) * scale).astype(np.float32)


def set_x_range(fig: go.Figure, x_range: tuple[float, float] | None) -> go.Figure:
    """Every chart spans the same window, so before and after line up across charts."""
    if x_range is not None:
        lo, hi = to_time(list(x_range))
        fig.update_xaxes(range=[lo, hi])
    return fig


def layout(title: str, ytitle: str, height: int = 340,
           x_range: tuple[float, float] | None = None, **extra: Any) -> dict:
    """The layout every time chart shares (as a dict: building figures from dicts once is
    ten times cheaper than updating plotly objects step by step)."""
    xaxis: dict[str, Any] = {"type": "date"}
    if x_range is not None:
        xaxis["range"] = x_ms(list(x_range)).tolist()
    out = {"title": {"text": title, "x": 0.01, "font": {"size": 14}}, "height": height,
           "margin": {"l": 50, "r": 10, "t": 40, "b": 30},
           "legend": {"orientation": "h", "y": -0.15, "yanchor": "top", "x": 0.0,
                      "xanchor": "left", "font": {"size": 11}},
           "hovermode": "x unified", "uirevision": "keep", "xaxis": xaxis,
           "yaxis": {"title": {"text": ytitle}}}
    out.update(extra)
    return out


def markers(events: pd.DataFrame | None, lay: dict) -> dict:
    """A dashed vertical line and a label for each config event (the newest MAX_MARKERS)."""
    if events is None or events.empty:
        return lay
    ev = events[events["kind"] == control.CONFIG].tail(MAX_MARKERS)
    xs = x_ms(ev["ts"]).tolist()
    # the autotuner's moves in their own colour ("autotune: num_workers 0→2")
    colors = [COLORS["autotune" if control.is_autotune(t) else "marker"] for t in ev["label"]]
    lay["shapes"] = [{"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "xref": "x",
                      "yref": "paper", "line": {"color": c, "width": 1, "dash": "dash"}}
                     for x, c in zip(xs, colors, strict=True)]
    lay["annotations"] = lay.get("annotations", []) + [
        {"x": x, "y": 1.0 - 0.09 * (i % 3), "xref": "x", "yref": "paper", "text": str(text),
         "showarrow": False, "xanchor": "left", "yanchor": "top",
         "font": {"size": 10, "color": c}, "bgcolor": "rgba(255,255,255,0.75)"}
        for i, (x, text, c) in enumerate(zip(xs, ev["label"], colors, strict=True))]
    return lay


def figure(data: list[dict], lay: dict) -> go.Figure:
    """The live charts' figure, built without plotly's per-property validation: the page
    rebuilds four of them every second, and validating took 45 of a refresh's ~60 ms of CPU
    (bench/ui_tick.py). tests/test_charts.py validates every chart's output instead."""
    return go.Figure({"data": data, "layout": lay}, _validate=False)


def line(x: Any, y: Any, name: str | None, **kw: Any) -> dict:
    return {"type": "scatter", "mode": "lines", "x": x, "y": y, "name": name, **kw}


def utilization_figure(
    busy: pd.DataFrame, gpu: pd.DataFrame | None = None, events: pd.DataFrame | None = None,
    simulated: bool = True, x_range: tuple[float, float] | None = None,
    source: str = "host timing",
) -> go.Figure:
    """The sawtooth chart: step-derived device busy (50 ms bins, or a long window's
    per-second envelope of them) and its 1 s mean, with NVML's utilization. `source` says
    where the busy series comes from: "CUDA events" (the device's own clock) or "host
    timing" (the step's compute as the host saw it)."""
    data = []
    if "busy_max" in busy.columns:  # a long window's per-second rollup: the 50 ms envelope
        e = downsample(busy, MAX_POINTS, value_col="busy_max")
        x = x_ms(e["t"])
        data += [line(x, y_list(e["busy_max"], 100), None, showlegend=False, opacity=0.35,
                      line={"color": COLORS["busy"], "width": 0.5}),
                 line(x, y_list(e["busy_min"], 100),
                      "50 ms bins: highest and lowest in each second", fill="tonexty",
                      opacity=0.35, line={"color": COLORS["busy"], "width": 0.5})]
        busy = busy[["t", "busy"]]
    else:
        b = downsample(busy, MAX_POINTS)
        data.append(line(x_ms(b["t"]), y_list(b["busy"], 100), "device busy, 50 ms bins"
                         + (" (simulated accelerator)" if simulated else f" ({source})"),
                         opacity=0.45,
                         line={"color": COLORS["busy"], "width": 1, "shape": "hv"}))
    if len(busy) > 1:  # the sawtooth's running mean: where it sits is the starvation
        bins = max(1, int(round(MEAN_WINDOW_S / max(float(busy["t"].diff().median()), 1e-9))))
        mean = busy["busy"].rolling(bins, min_periods=1).mean()
        m = downsample(pd.DataFrame({"t": busy["t"], "busy": mean}), MAX_POINTS)
        data.append(line(x_ms(m["t"]), y_list(m["busy"], 100),
                         f"device busy, {MEAN_WINDOW_S:g} s mean",
                         line={"color": COLORS["busy"], "width": 2.5}))
    if gpu is not None and not gpu.empty:  # the gpu_util frame: every driver sample
        for idx, g in gpu.groupby("gpu"):
            g = downsample(g[["ts", "util_pct"]].rename(columns={"ts": "t"}), MAX_POINTS)
            data.append(line(x_ms(g["t"]), y_list(g["util_pct"]),
                             f"GPU {idx} utilization (NVML)",
                             line={"color": COLORS["gpu"], "width": 1.5, "shape": "hv"}))
    lay = layout("Device utilization (a sawtooth = starved)", "busy", 300, x_range)
    lay["yaxis"].update(range=[-2, 105], ticksuffix="%")
    return figure(data, markers(events, lay))


RANK_LINES_MAX = 8  # beyond this many ranks: min/median/max band and the worst ranks by name
RANK_BIN_S = 1.0


def rank_wait_figure(steps: pd.DataFrame, events: pd.DataFrame | None = None,
                     x_range: tuple[float, float] | None = None) -> go.Figure:
    """Data wait per step, per rank, averaged per second: one line per rank up to
    RANK_LINES_MAX; beyond, the min-median-max band over ranks and the 3 worst ranks."""
    data = []
    if not steps.empty and "rank" in steps.columns:
        t0 = float(steps["ts"].min())
        b = ((steps["ts"] - t0) // RANK_BIN_S).astype(int)
        per = steps.assign(bin=b).groupby(["bin", "rank"])["wait_s"].mean().unstack("rank")
        x = x_ms(t0 + per.index.to_numpy() * RANK_BIN_S)
        shown = list(per.columns)
        if len(shown) > RANK_LINES_MAX:
            for name, q, fill in (("min", per.min(axis=1), None),
                                  ("median", per.median(axis=1), "tonexty"),
                                  ("max", per.max(axis=1), "tonexty")):
                data.append(line(x, y_list(q, 1000), f"{name} over ranks", fill=fill,
                                 line={"width": 1}))
            shown = list(per.mean().sort_values(ascending=False).index[:3])
        data += [line(x, y_list(per[r], 1000), f"rank {r}", line={"width": 2})
                 for r in shown]
    lay = layout("Data wait per step, by rank (1 s means)", "ms", 340, x_range)
    return figure(data, markers(events, lay))


def wait_compute_figure(
    steps: pd.DataFrame, events: pd.DataFrame | None = None,
    x_range: tuple[float, float] | None = None,
) -> go.Figure:
    """Per step, stacked: compute (bottom) and data wait (top); their sum is the step time."""
    data = []
    if not steps.empty:
        s = steps[["ts", "wait_s", "compute_s"]]
        s = downsample(s.assign(step=s["wait_s"] + s["compute_s"]), MAX_POINTS, "ts", "step")
        x = x_ms(s["ts"])
        data = [line(x, y_list(s["compute_s"], 1000), "compute", stackgroup="step",
                     line={"color": COLORS["compute"], "width": 0.5}),
                line(x, y_list(s["wait_s"], 1000), "data wait", stackgroup="step",
                     line={"color": COLORS["wait"], "width": 0.5})]
    lay = layout("Data wait vs compute per step", "ms per step", 340, x_range)
    lay["yaxis"]["rangemode"] = "tozero"
    return figure(data, markers(events, lay))


PHASE_COLORS = {"data_wait": COLORS["wait"], "copy": "#8c564b", "forward": "#17becf",
                "backward": "#1f77b4", "optimizer": "#bcbd22", "other": "#c7c7c7"}


def phases_figure(steps: pd.DataFrame, events: pd.DataFrame | None = None,
                  x_range: tuple[float, float] | None = None) -> go.Figure | None:
    """Per step, stacked: where it went (monitor/assess/phases.py: data wait, the copy to
    the device, forward, backward, optimizer step, other); None where no phase was timed."""
    from monitor.assess import phases

    ph = phases.per_step(steps) if not steps.empty else None
    if ph is None:
        return None
    s = downsample(ph.assign(ts=steps["ts"], step=ph.sum(axis=1)), MAX_POINTS, "ts", "step")
    x = x_ms(s["ts"])
    data = [line(x, y_list(s[p], 1000), phases.LABELS[p], stackgroup="phases",
                 line={"color": PHASE_COLORS[p], "width": 0.5})
            for p in reversed(phases.PHASES) if p != "copy" or (s[p] > 0).any()]
    sampled = f"; 1 step in {len(steps) / len(ph):.0f} timed" if len(ph) * 1.5 < len(steps) \
        else ""  # (NOTE [phase sampling])
    lay = layout(f"Where each step goes ({phases.source(steps)}{sampled})", "ms per step", 340,
                 x_range)
    lay["yaxis"]["rangemode"] = "tozero"
    return figure(data, markers(events, lay))


def throughput_figure(
    thr: pd.DataFrame, events: pd.DataFrame | None = None,
    x_range: tuple[float, float] | None = None,
) -> go.Figure:
    t = downsample(thr, MAX_POINTS)
    data = [line(x_ms(t["t"]), y_list(t["throughput"]), "samples/s",
                 line={"color": COLORS["throughput"], "width": 1.5, "shape": "hv"})]
    lay = layout("Throughput", "samples/s", 340, x_range)
    lay["yaxis"]["rangemode"] = "tozero"
    return figure(data, markers(events, lay))


def _cores(col: pd.Series, n: int) -> np.ndarray:
    """The per-core CPU column (a JSON list of `n` per row) as a rows x n array, in one
    parse; NaN in a row without it."""
    rows = [v if isinstance(v, str) and v.count(",") + 1 == n else
            "[" + ",".join(["null"] * n) + "]" for v in col]
    return np.array(json.loads("[" + ",".join(rows) + "]"), dtype=float).reshape(len(rows), n)


HOST_ROWS = {"y": (0.70, 1.0), "y2": (0.36, 0.64), "y3": (0.0, 0.30)}
# a line a core up to this many; above it, three lines at each sample (the busiest core, the
# median one, the idlest): 192 cores drew 198 traces and a 192-entry legend, 468 KB and 170 ms
# of Plotly in Chromium a redraw against 36 ms at 2 cores (bench/host_chart.py), and no
# reader follows 192 lines
PER_CORE_MAX = 8


CORE_FIGURES = {"busiest core": "cpu_busiest_core_pct", "median core": "cpu_median_core_pct",
                "idlest core": "cpu_idlest_core_pct"}


def _core_lines(host: pd.DataFrame) -> tuple[int, dict[str, np.ndarray]]:
    """The host's cores and the CPU panel's lines by name (NaN: a row without a reading).
    Above PER_CORE_MAX the three stored figures (HostSample's); only rows stored before
    them are parsed."""
    col = host["cpu_per_core"] if "cpu_per_core" in host.columns else pd.Series(dtype=object)
    n = max((v.count(",") + 1 for v in col if isinstance(v, str) and v != "[]"), default=0)
    if n <= PER_CORE_MAX:
        per_core = _cores(col, n)
        return n, {f"core {c}": per_core[:, c] for c in range(n)}
    stored = np.column_stack([host[c].to_numpy(dtype=float, na_value=np.nan)
                              if c in host.columns else np.full(len(host), np.nan)
                              for c in CORE_FIGURES.values()])
    old = np.isnan(stored).all(axis=1) & col.notna().to_numpy()
    if old.any():
        per_core = _cores(col[old], n)
        with warnings.catch_warnings():  # (a row with no reading is all NaN: a gap)
            warnings.simplefilter("ignore", RuntimeWarning)
            stored[old] = np.column_stack([np.nanmax(per_core, axis=1),
                                           np.nanmedian(per_core, axis=1),
                                           np.nanmin(per_core, axis=1)])
    return n, dict(zip(CORE_FIGURES, stored.T, strict=True))


def host_figure(
    host: pd.DataFrame, events: pd.DataFrame | None = None,
    x_range: tuple[float, float] | None = None,
) -> go.Figure:
    """Host: CPU per core (above PER_CORE_MAX cores, the busiest, the median and the idlest
    at each sample); memory and /dev/shm; the workload's DataLoader workers (three stacked
    panels on one time axis)."""
    data = []
    cpu_title = "CPU per core (%)"
    if not host.empty:
        n, cores = _core_lines(host)
        if n > PER_CORE_MAX:
            cpu_title = f"CPU of {n} cores: the busiest, the median and the idlest (%)"
        cols = ["ts", "mem_used_mb", "shm_used_mb", "proc_rss_mb", "workers",
                "workers_cpu_pct", "workers_rss_mb"]
        h = pd.concat([host[[c for c in cols if c in host.columns]].reset_index(drop=True),
                       pd.DataFrame(cores)], axis=1).astype(float)
        h = downsample(h, MAX_POINTS, "ts")
        x = x_ms(h["ts"])
        data += [line(x, y_list(h[name]), name, yaxis="y", line={"width": 1},
                      legendgroup="cpu") for name in cores]
        data += [line(x, y_list(h[name]), label(HostSample, name), yaxis=ax)
                 for name, ax in (("mem_used_mb", "y2"), ("shm_used_mb", "y2"),
                                  ("proc_rss_mb", "y2"), ("workers_cpu_pct", "y3"),
                                  ("workers_rss_mb", "y3")) if name in h.columns]
        if "workers" in h.columns:
            data.append(line(x, y_list(h["workers"]), label(HostSample, "workers"),
                             yaxis="y4", line={"shape": "hv", "dash": "dot"}))
    lay = layout("Host", "", 480, x_range)
    titles = (cpu_title, "memory (MB)", "DataLoader workers: count, CPU (%), RSS (MB)")
    for (ax, (lo, hi)), title in zip(HOST_ROWS.items(), titles, strict=True):
        lay["yaxis" + ax[1:]] = {"domain": [lo, hi], "anchor": "x"}
        lay.setdefault("annotations", []).append(
            {"text": title, "x": 0.0, "y": hi, "xref": "paper", "yref": "paper",
             "showarrow": False, "xanchor": "left", "yanchor": "bottom",
             "font": {"size": 12}})
    lay["yaxis"]["range"] = [0, 105]
    lay["yaxis4"] = {"overlaying": "y3", "side": "right", "anchor": "x"}
    # the one time axis under the bottom panel: anchored to the top one (plotly's default)
    # its tick and date labels fell on the memory panel's title
    lay["xaxis"]["anchor"] = "y3"
    return figure(data, markers(events, lay))


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
    fig.update_layout(markers(events, {}))
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


def _plain_layout(fig: go.Figure, title: str, ytitle: str) -> go.Figure:
    lay = layout(title, ytitle)
    lay.pop("xaxis")
    fig.update_layout(lay)
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
    return _plain_layout(fig, title, ytitle)


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
    return _plain_layout(fig, "Data wait per step: share of steps at or below", "steps")
