"""Pure functions over the store's frames: shares, busy series, throughput, sawtooth.

Definitions (DESIGN.md): data wait, compute, data-wait share = Σwait / Σ(wait + compute),
device busy = the fraction of each 50 ms bin covered by compute intervals, throughput =
samples per second of the training loop's own time (its steps: the window less the pauses
between epochs, reported apart as `between_epochs_s`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from monitor.thresholds import (
    ALIGN_BIN_S,
    DEVICE_CLOCK_MIN_SHARE,
    IDLE_GAP_MIN_S,
    SAWTOOTH_MIN_AC,
    SAWTOOTH_MIN_STD,
    SPIKE_MIN_S,
    SPIKE_X,
    VERDICT_MIN_STEPS,
    WARMUP_SETTLED_X,
)

BUSY_BIN_S = 0.05


def data_wait_share(steps: pd.DataFrame) -> float:
    if steps.empty:
        return float("nan")
    wait = float(steps["wait_s"].sum())
    total = wait + float(steps["compute_s"].sum())
    return wait / total if total > 0 else float("nan")


def loop_rate(steps: pd.DataFrame) -> float:
    """Samples per second of the loop's own steps (data wait + compute), NaN without any:
    the rate a measured stretch of steps ran at, however the steps sit in time (the
    outcome of a change, a part of a window for its noise)."""
    loop = float(steps["wait_s"].sum() + steps["compute_s"].sum()) if not steps.empty else 0.0
    return float(steps["samples"].sum()) / loop if loop > 0 else float("nan")


def cv(values: pd.Series) -> float:
    """The coefficient of variation of a series (NaN where its mean is not positive)."""
    _, c = series_stats(values)
    return c if c is not None else float("nan")


def starts(steps: pd.DataFrame) -> pd.Series:
    """When each step began: when it asked for its batch (a step's data wait is
    [ts - wait_s, ts], monitor/records.py)."""
    return steps["ts"] - steps["wait_s"]


def span(steps: pd.DataFrame) -> tuple[float, float]:
    """(start, end) of the steps: first wait start to last compute end."""
    start = float(starts(steps).min())
    end = float((steps["ts"] + steps["compute_s"]).max())
    return start, end


def run_rows(host: pd.DataFrame, run_id: int) -> pd.DataFrame:
    """The host rows sampled for this run (a collector may sample another run at the same
    time); no rows when none are this run's."""
    if host.empty or "run_id" not in host.columns:
        return host
    return host[host["run_id"] == run_id]


def rank_rows(frame: pd.DataFrame, rank: int) -> pd.DataFrame:
    """The one rank cut: `frame`'s rows of `rank`, a row with no rank (a one-process run's)
    counting as rank 0; a frame with no ranks at all (no column, or host rows sampled for
    the whole node) is every rank's, and comes back whole."""
    if frame.empty or "rank" not in frame.columns or not frame["rank"].notna().any():
        return frame
    return frame[frame["rank"].fillna(0) == rank]


def own_rows(frame: pd.DataFrame, rank: int) -> pd.DataFrame:
    """The rows that are `rank`'s own, by the rank written on them (a job's per-rank host
    samples): none where the frame has no rank column. rank_rows is the cut for rows that
    may be the whole node's."""
    if "rank" not in frame.columns:
        return frame.iloc[0:0]
    return frame[frame["rank"] == rank]


def workers_memory_mb(host: pd.DataFrame) -> pd.Series:
    """The DataLoader workers' memory per host row, MB: their USS (what each adds beyond the
    pages it shares with its parent; read one sampler pass in 8, so carried forward), else
    their RSS where USS is not read. The one home of "USS, else RSS" over rows."""
    if host.empty:
        return pd.Series(dtype=float)
    rss = pd.to_numeric(host["workers_rss_mb"], errors="coerce") \
        if "workers_rss_mb" in host.columns else pd.Series(math.nan, index=host.index)
    if "workers_uss_mb" not in host.columns:
        return rss
    return pd.to_numeric(host["workers_uss_mb"], errors="coerce").ffill().fillna(rss)


def stepping_s(steps: pd.DataFrame) -> float:
    """Seconds some step was under way (the union of every step's [wait start, compute end],
    all ranks together): the window less the time outside the training loop's steps, the
    pauses between epochs (a validation pass, a checkpoint) and the probe's own writes."""
    if steps.empty:
        return 0.0
    a = starts(steps).to_numpy(dtype=float)
    b = (steps["ts"] + steps["compute_s"]).to_numpy(dtype=float)
    order = np.argsort(a, kind="stable")
    a, b = a[order], np.maximum.accumulate(b[order])
    gaps = np.clip(a[1:] - b[:-1], 0.0, None)  # no step under way between these
    return float(b[-1] - a[0] - gaps.sum())


def throughput(steps: pd.DataFrame) -> float:
    """Samples per second of the training loop's own time (stepping_s): torchvision's
    train.py at 2 workers read 20-30% below its own in-epoch rate over the span, its
    validation pause inside the window."""
    if steps.empty:
        return float("nan")
    t = stepping_s(steps)
    return float(steps["samples"].sum()) / t if t > 0 else float("nan")


def busy_series(
    steps: pd.DataFrame, bin_s: float = BUSY_BIN_S, start: float | None = None,
    end: float | None = None,
) -> pd.DataFrame:
    """Device busy per bin: the fraction of [t, t + bin_s) covered by compute intervals.

    Columns: t (bin start, wall seconds), busy (0..1). Intervals are a process's sequential
    steps, so they do not overlap; the covered time up to any instant is a cumulative sum.
    """
    if steps.empty:
        return pd.DataFrame({"t": pd.Series(dtype=float), "busy": pd.Series(dtype=float)})
    s = steps["ts"].to_numpy(dtype=float)
    order = np.argsort(s)
    s = s[order]
    d = np.clip(steps["compute_s"].to_numpy(dtype=float)[order], 0.0, None)
    lo = s[0] - steps["wait_s"].iloc[order[0]] if start is None else start
    hi = float((s + d).max()) if end is None else end
    n = max(1, int(math.ceil((hi - lo) / bin_s - 1e-9)))
    edges = lo + bin_s * np.arange(n + 1)
    cum = np.concatenate([[0.0], np.cumsum(d)])  # covered time before interval i starts
    idx = np.searchsorted(s, edges, side="right") - 1  # last interval starting at or before
    covered = np.where(
        idx >= 0, cum[np.maximum(idx, 0)] + np.clip(edges - s[np.maximum(idx, 0)], 0.0,
                                                    d[np.maximum(idx, 0)]), 0.0)
    busy = np.diff(covered) / bin_s
    return pd.DataFrame({"t": edges[:-1], "busy": np.clip(busy, 0.0, 1.0)})


def throughput_series(steps: pd.DataFrame, bin_s: float = 1.0) -> pd.DataFrame:
    """Samples/s per bin of `bin_s` seconds, counting each batch when it arrived."""
    if steps.empty:
        return pd.DataFrame({"t": pd.Series(dtype=float), "throughput": pd.Series(dtype=float)})
    t0 = float(steps["ts"].min())
    b = ((steps["ts"] - t0) // bin_s).astype(int)
    per = steps.groupby(b)["samples"].sum()
    full = per.reindex(range(int(b.max()) + 1), fill_value=0)
    out = pd.DataFrame({"t": t0 + full.index.to_numpy() * bin_s,
                        "throughput": full.to_numpy() / bin_s})
    return out.iloc[:-1] if len(out) > 1 else out  # the last bin is still filling


@dataclass(frozen=True, slots=True)
class Summary:
    """The window's headline figures (DESIGN.md definitions), over `window_s` seconds: from
    the first step's wait start to the last step's compute end."""

    steps: int
    window_s: float
    throughput: float
    data_wait_share: float
    device_busy_mean: float
    device_busy_cv: float
    between_epochs_s: float = 0.0  # of window_s, no step under way (validation, checkpoints)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def summarize(steps: pd.DataFrame) -> Summary:
    if steps.empty:
        nan = float("nan")
        return Summary(0, 0.0, nan, nan, nan, nan)
    start, end = span(steps)
    busy = busy_series(steps, start=start, end=end)["busy"]
    return Summary(
        steps=len(steps), window_s=end - start, throughput=throughput(steps),
        data_wait_share=data_wait_share(steps), device_busy_mean=float(busy.mean()),
        device_busy_cv=cv(busy),
        between_epochs_s=max(0.0, (end - start) - stepping_s(steps)),
    )


def series_stats(values: pd.Series) -> tuple[float | None, float | None]:
    """(mean, coefficient of variation) of a series, None where undefined."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return None, None
    mean = float(v.mean())
    return mean, (float(v.std(ddof=0)) / mean if mean > 0 else None)


def idle_gaps(steps: pd.DataFrame, min_gap_s: float = IDLE_GAP_MIN_S) -> tuple[int, float | None]:
    """(count, median seconds) of device-idle gaps between consecutive compute intervals
    longer than `min_gap_s` (shorter ones are the loop's own overhead)."""
    if len(steps) < 2:
        return 0, None
    s = steps.sort_values("ts")
    ends = (s["ts"] + s["compute_s"]).to_numpy()[:-1]
    gaps = s["ts"].to_numpy()[1:] - ends
    gaps = gaps[gaps >= min_gap_s]
    return int(len(gaps)), (float(np.median(gaps)) if len(gaps) else None)


def sawtooth(busy: pd.DataFrame, bin_s: float = BUSY_BIN_S) -> tuple[float | None, float]:
    """(dominant period in seconds, duty cycle) of the busy series.

    The period is the lag of the highest autocorrelation peak after the first zero crossing
    (None for a flat line or no repeating pattern, peak below SAWTOOTH_MIN_AC); the duty
    cycle is the busy mean."""
    x = busy["busy"].to_numpy(dtype=float)
    duty = float(x.mean()) if len(x) else float("nan")
    if len(x) < 8 or x.std() < SAWTOOTH_MIN_STD:
        return None, duty
    x = x - x.mean()
    n = len(x)
    f = np.fft.rfft(x, 2 * n)
    ac = np.fft.irfft(f * np.conj(f))[: n // 2]
    ac = ac / ac[0]
    below = np.nonzero(ac < 0)[0]
    if not len(below):
        return None, duty
    start = below[0]
    lag = start + int(np.argmax(ac[start:]))
    if ac[lag] < SAWTOOTH_MIN_AC:
        return None, duty
    return lag * bin_s, duty


def epoch_stalls(steps: pd.DataFrame, first_over_s: float | None = None,
                 step_too: bool = False) -> tuple[int, float, float | None, float]:
    """(epoch starts seen, seconds lost at them, median time to first batch, of the seconds
    lost those in the epochs' first steps).

    An epoch's first wait includes starting its workers and filling the prefetch queue; what
    it costs beyond a typical step's wait is lost to every epoch. The window's first epoch
    may have started before it and is left out, unless its first wait is at least
    `first_over_s` (plainly a start). `step_too`: the step runs on the host's CPU, where the
    workers starting take the cores from the epoch's first step: what that step took beyond
    a typical one is lost too (tests/scripts/vision_train.py -j 2, 6 steps an epoch: a
    first step of 0.31 s against 0.05 s, its batch there after 0.05 s; persistent workers
    halved the epoch, 0.64 to 0.33 s bare)."""
    if steps.empty or "epoch" not in steps.columns:
        return 0, 0.0, None, 0.0
    ordered = steps.sort_values("ts").groupby("epoch")
    first, first_step = ordered["wait_s"].first(), ordered["compute_s"].first()
    epochs = steps.groupby("epoch")["step"].min()
    if first_over_s is not None and len(first) and first.iloc[0] >= first_over_s:
        index = first.index
    else:
        index = epochs.index[epochs.index > steps["epoch"].min()] if len(first) > 1 \
            else first.index[0:0]
    starts = first[index]
    lost = float(np.clip(starts - float(steps["wait_s"].median()), 0, None).sum())
    in_step = float(np.clip(first_step[index] - float(steps["compute_s"].median()), 0,
                            None).sum()) if step_too else 0.0
    return (int(len(starts)), lost + in_step,
            (float(starts.median()) if len(starts) else None), in_step)


def device_timing(steps: pd.DataFrame) -> dict[str, float] | None:
    """The device's own clock on CUDA (events, monitor/probe/device_clock.py): its idle
    share Σ idle / Σ (idle + span) and busy per step, over the steps that have both; None
    when fewer than half the steps were measured (a CPU run: never)."""
    if steps.empty or "device_span_s" not in steps.columns:
        return None
    both = steps.dropna(subset=["device_idle_s", "device_span_s"])
    if len(both) < max(VERDICT_MIN_STEPS, DEVICE_CLOCK_MIN_SHARE * len(steps)):
        return None
    idle, span = both["device_idle_s"].astype(float), both["device_span_s"].astype(float)
    total = float((idle + span).sum())
    if not total > 0:
        return None
    busy = span / (idle + span).where(idle + span > 0)
    return {"idle_share": float(idle.sum()) / total, "busy_mean": float(busy.mean()),
            "busy_cv": cv(busy),
            "idle_per_step_s": float(idle.mean()), "measured": float(len(both))}


def step_tail(steps: pd.DataFrame) -> dict[str, float | int | None]:
    """Step time's median and 99th percentile, and the tail stalls: steps whose data wait
    is at least SPIKE_X median steps (and SPIKE_MIN_S), with their share of all the wait.
    An epoch's first step is not one: its wait is the epoch start's (epoch_stalls)."""
    out: dict[str, float | int | None] = {"p50": None, "p99": None, "spikes": 0,
                                          "spike_wait_share": None}
    if steps.empty:
        return out
    step = steps["wait_s"] + steps["compute_s"]
    p50 = float(step.median())
    out.update(p50=p50, p99=float(step.quantile(0.99)))
    spike = steps["wait_s"] >= max(SPIKE_X * p50, SPIKE_MIN_S)
    if "epoch" in steps.columns:
        spike &= ~steps.index.isin(steps.sort_values("ts").groupby("epoch").head(1).index)
    total = float(steps["wait_s"].sum())
    out.update(spikes=int(spike.sum()),
               spike_wait_share=float(steps.loc[spike, "wait_s"].sum()) / total
               if total > 0 else None)
    return out


def warmup(first: pd.DataFrame, steady_step_s: float, run_s: float,
           ) -> dict[str, float | int] | None:
    """The run's warm-up from its first steps (one rank's, in order): the steps until one
    takes at most WARMUP_SETTLED_X steady steps, and the time they took beyond steady steps,
    also as a share of the run's stepping (`run_s`: its first step's start to its last)."""
    if first.empty or not steady_step_s > 0 or not run_s > 0:
        return None
    step = (first["wait_s"] + first["compute_s"]).to_numpy()
    settled = np.flatnonzero(step <= WARMUP_SETTLED_X * steady_step_s)
    n = int(settled[0]) if len(settled) else len(step)
    lost = float(np.clip(step[:n] - steady_step_s, 0, None).sum())
    return {"steps": n, "lost_s": lost, "share": min(1.0, lost / run_s),
            "first_step_s": float(step[0])}


def nvml_vs_busy(util: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float | None]:
    """Compare NVML's utilization samples with the step-derived busy series.

    Each NVML sample averages the period before its time stamp, so it is paired with device
    busy over [ts - spacing, ts], spacing being the median gap between the driver's samples.
    Returns the Pearson correlation of the pairs and the spacing in seconds.
    """
    u = util.dropna(subset=["util_pct"]).sort_values("ts")
    if len(u) < 3 or steps.empty:
        return {"correlation": None, "spacing_s": None, "pairs": 0}
    spacing = float(u["ts"].diff().median())
    if not spacing > 0:
        return {"correlation": None, "spacing_s": None, "pairs": 0}
    start, end = span(steps)
    fine = busy_series(steps, ALIGN_BIN_S, start, end)
    cum = np.concatenate([[0.0], np.cumsum(fine["busy"].to_numpy() * ALIGN_BIN_S)])
    t = u["ts"].to_numpy()
    keep = (t - spacing >= start) & (t <= end)
    if keep.sum() < 3:
        return {"correlation": None, "spacing_s": spacing, "pairs": int(keep.sum())}
    hi = np.clip(((t[keep] - start) / ALIGN_BIN_S).astype(int), 0, len(cum) - 1)
    lo = np.clip(((t[keep] - spacing - start) / ALIGN_BIN_S).astype(int), 0, len(cum) - 1)
    busy = (cum[hi] - cum[lo]) / np.maximum((hi - lo) * ALIGN_BIN_S, 1e-9)
    nv = u["util_pct"].to_numpy()[keep] / 100.0
    if np.std(busy) == 0 or np.std(nv) == 0:
        corr = None
    else:
        corr = float(np.corrcoef(busy, nv)[0, 1])
    return {"correlation": corr, "spacing_s": spacing, "pairs": int(keep.sum())}


def steady_state(steps: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """Steps after the first `warmup_s` seconds of the run (worker start-up, first batches)."""
    if steps.empty:
        return steps
    return steps[starts(steps) >= span(steps)[0] + warmup_s]


def downsample(df: pd.DataFrame, max_points: int, time_col: str = "t",
               value_col: str | None = None) -> pd.DataFrame:
    """At most `max_points` rows, chosen by MinMaxLTTB (tsdownsample) on `value_col` (the
    first column after `time_col` by default): each bucket's extremes survive, so a
    sawtooth keeps its peaks and troughs at every zoom, where group means would flatten it."""
    if len(df) <= max_points:
        return df
    from tsdownsample import MinMaxLTTBDownsampler

    col = value_col or next(c for c in df.columns if c != time_col)
    x = df[time_col].to_numpy(dtype=float)
    y = np.nan_to_num(df[col].to_numpy(dtype=float))
    idx = MinMaxLTTBDownsampler().downsample(x, y, n_out=max(max_points, 4))
    return df.iloc[np.sort(idx)].reset_index(drop=True)


def busy_from_seconds(sec: pd.DataFrame, bin_s: float = BUSY_BIN_S) -> pd.DataFrame:
    """Device busy per second from the per-second rollup: the mean (Σ compute / 1 s), and
    the envelope the 50 ms bins would show inside that second (a bin is fully busy when a
    step computed at least a bin long, fully idle when one waited that long). Columns: t,
    busy, busy_min, busy_max."""
    if sec.empty:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in ("t", "busy", "busy_min",
                                                                   "busy_max")})
    if sec["rank"].nunique() == 1:  # one process: a row per second already
        g = sec.set_index("sec").assign(ranks=1)
    else:
        g = sec.groupby("sec").agg(compute_s=("compute_s", "sum"), ranks=("rank", "nunique"),
                                   max_wait_s=("max_wait_s", "max"),
                                   max_compute_s=("max_compute_s", "max"))
    busy = np.clip(g["compute_s"] / g["ranks"], 0.0, 1.0)
    lo = np.where(g["max_wait_s"] >= bin_s, 0.0, np.clip(1 - g["max_wait_s"] / bin_s, 0, 1))
    hi = np.where(g["max_compute_s"] >= bin_s, 1.0, np.clip(g["max_compute_s"] / bin_s, 0, 1))
    return pd.DataFrame({"t": g.index.to_numpy(dtype=float), "busy": busy.to_numpy(),
                         "busy_min": np.minimum(lo, busy), "busy_max": np.maximum(hi, busy)})
