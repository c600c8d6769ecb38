"""Analysis over frames: data-wait share, device busy (50 ms bins), throughput, verdict."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from monitor.frames import analysis


def steps_frame(wait: list[float], compute: list[float], samples: int = 32, t0: float = 1000.0):
    """Sequential steps: wait, then compute, back to back."""
    ts, t = [], t0
    for w, c in zip(wait, compute, strict=True):
        t += w
        ts.append(t)
        t += c
    return pd.DataFrame({"ts": ts, "wait_s": wait, "compute_s": compute,
                         "samples": [samples] * len(wait)})


def brute_busy(df: pd.DataFrame, start: float, end: float, bin_s: float) -> np.ndarray:
    n = int(math.ceil((end - start) / bin_s))
    out = np.zeros(n)
    for s, d in zip(df["ts"], df["compute_s"], strict=True):
        for i in range(n):
            a, b = start + i * bin_s, start + (i + 1) * bin_s
            out[i] += max(0.0, min(b, s + d) - max(a, s))
    return out / bin_s


def test_starving_sawtooth_scenario():
    df = steps_frame([0.1] * 20, [0.05] * 20)
    s = analysis.summarize(df)
    assert s.data_wait_share == pytest.approx(2 / 3)
    assert s.device_busy_mean == pytest.approx(1 / 3, abs=0.02)
    assert s.device_busy_cv > 1.0  # on/off: a sawtooth
    assert s.throughput == pytest.approx(20 * 32 / 3.0)


def test_throughput_is_the_loops_own_time_with_the_pauses_between_epochs_apart():
    """Two epochs of 20 steps (3 s each) with a 2 s validation pass between them: 40
    batches in 6 s of stepping, the pause reported apart (a rate over the span read 25%
    low: torchvision's train.py against its own in-epoch rate)."""
    one = steps_frame([0.1] * 20, [0.05] * 20)
    two = steps_frame([0.1] * 20, [0.05] * 20, t0=1000.0 + 3.0 + 2.0)
    s = analysis.summarize(pd.concat([one, two], ignore_index=True))
    assert s.window_s == pytest.approx(8.0)
    assert s.between_epochs_s == pytest.approx(2.0)
    assert s.throughput == pytest.approx(40 * 32 / 6.0)
    # two ranks stepping side by side: the time some step was under way, not their sum
    other = steps_frame([0.1] * 20, [0.05] * 20, t0=1000.05)
    both = analysis.summarize(pd.concat([one, other], ignore_index=True))
    assert both.between_epochs_s == pytest.approx(0.0, abs=1e-9)
    assert both.throughput == pytest.approx(40 * 32 / 3.05)


def test_fed_device_is_a_flat_line():
    df = steps_frame([0.001] * 50, [0.06] * 50)
    s = analysis.summarize(df)
    assert s.data_wait_share < 0.02
    assert s.device_busy_mean > 0.95 and s.device_busy_cv < 0.15


def test_busy_series_matches_brute_force():
    rng = np.random.default_rng(1)
    df = steps_frame(list(rng.uniform(0, 0.12, 60)), list(rng.uniform(0.01, 0.09, 60)))
    start, end = analysis.span(df)
    fast = analysis.busy_series(df, 0.05, start, end)
    slow = brute_busy(df, start, end, 0.05)
    assert len(fast) == len(slow)
    np.testing.assert_allclose(fast["busy"].to_numpy(), np.clip(slow, 0, 1), atol=1e-9)


def test_busy_series_window_before_and_after_steps_is_idle():
    df = steps_frame([0.0], [0.1], t0=10.0)
    b = analysis.busy_series(df, 0.05, start=9.9, end=10.3)
    assert b["busy"].round(6).tolist() == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_empty_window_gives_no_data_verdict():
    from monitor.diagnosis import NO_DATA, diagnose, features
    from monitor.records import CpuBudget

    empty = pd.DataFrame(columns=["ts", "wait_s", "compute_s", "samples"])
    s = analysis.summarize(empty)
    assert s.steps == 0
    f = features(empty, pd.DataFrame(), {"num_workers": 0, "batch_size": 8},
                 CpuBudget(2, None, 2, None, None))
    assert diagnose(f).verdict == NO_DATA
    assert s.to_dict()["throughput"] is None
    assert analysis.busy_series(empty).empty


def test_throughput_series_counts_samples_per_second():
    df = steps_frame([0.0] * 40, [0.1] * 40, samples=10)
    thr = analysis.throughput_series(df, 1.0)
    assert thr["throughput"].iloc[:3].tolist() == [100.0, 100.0, 100.0]


def test_steady_state_drops_warmup():
    df = steps_frame([1.0] + [0.01] * 30, [0.1] * 31)
    assert len(analysis.steady_state(df, 1.5)) < 31
    assert analysis.steady_state(df, 0.0).equals(df)


def test_downsample_keeps_mean_and_caps_points():
    df = pd.DataFrame({"t": np.arange(12000) * 0.05, "busy": np.tile([0.0, 1.0], 6000)})
    d = analysis.downsample(df, 5000)
    assert len(d) <= 5000
    assert d["busy"].mean() == pytest.approx(0.5, abs=0.01)
    small = df.head(10)
    assert analysis.downsample(small, 5000).equals(small)  # under the cap: untouched


def test_nvml_vs_busy_correlates_a_matching_sawtooth():
    # a 0.5 s period: 0.25 s busy, 0.25 s waiting; NVML samples every 1/6 s
    df = steps_frame([0.25] * 40, [0.25] * 40)
    start, end = analysis.span(df)
    ts = np.arange(start + 0.5, end, 1 / 6)
    b = analysis.busy_series(df, 0.01, start, end)
    cum = np.concatenate([[0], np.cumsum(b["busy"] * 0.01)])
    idx = ((ts - start) / 0.01).astype(int)
    true = (cum[idx] - cum[idx - int(round((1 / 6) / 0.01))]) / (1 / 6)
    util = pd.DataFrame({"ts": ts, "util_pct": true * 100})
    r = analysis.nvml_vs_busy(util, df)
    assert r["spacing_s"] == pytest.approx(1 / 6, rel=0.01)
    assert r["correlation"] > 0.9 and r["pairs"] > 50
    shuffled = util.assign(util_pct=np.random.default_rng(0).permutation(util["util_pct"]))
    assert abs(analysis.nvml_vs_busy(shuffled, df)["correlation"]) < 0.5
    assert analysis.nvml_vs_busy(util.head(2), df)["correlation"] is None
