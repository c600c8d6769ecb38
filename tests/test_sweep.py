"""Sweep and autotune on synthetic response surfaces (deterministic), and the knee."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from monitor.config import LoaderConfig
from monitor.tuning.search import (
    ConfigResult,
    SweepState,
    autotune,
    find_knee,
    grid,
    memory_fits,
    run_sweep,
)

BASE = LoaderConfig.build(preset="starving")


def surface(kind: str):
    """Throughput as a function of the settings, like the presets on a 2-core machine."""
    def thr(cfg: LoaderConfig) -> float:
        n, pf = cfg.num_workers, cfg.prefetch_factor or 2
        if kind == "starving":  # two workers feed the device; beyond, contention
            base = {0: 190, 1: 300, 2: 470, 3: 465, 4: 440}.get(n, 400)
        elif kind == "io-bound":  # workers beyond cores keep helping (measured: best at 6)
            base = {0: 165, 1: 200, 2: 390, 3: 580, 4: 741, 5: 820}.get(n, 865)
        elif kind == "cpu-bound":  # plateau at the core count
            base = {0: 130, 1: 150, 2: 240, 3: 236, 4: 225}.get(n, 220)
        else:
            raise ValueError(kind)
        return base * (1.0 + 0.01 * (pf - 2))  # prefetch barely matters
    return thr


def fake_measure(kind: str, log: list):
    thr = surface(kind)

    def measure(cfg: LoaderConfig) -> ConfigResult:
        log.append(cfg)
        t = thr(cfg)
        advised = {"starving": 2, "io-bound": 5, "cpu-bound": 2}[kind] if cfg.num_workers == 0 \
            else None
        verdict = "cpu-bound" if kind == "cpu-bound" and cfg.num_workers >= 2 else "starving"
        advice = [{"param": "num_workers", "value": advised,
                   "predicted_throughput": thr(cfg.replace(num_workers=advised))}] \
            if advised else []
        return ConfigResult(cfg, run_id=len(log), throughput=t, throughput_spread=0.02,
                            data_wait_share=max(0.0, 1 - t / 900), device_busy_mean=t / 900,
                            peak_memory_mb=300 + 200 * cfg.num_workers, seconds=10.0,
                            advised_workers=advised, verdict=verdict,
                            assessment={"advice": advice, "throughput_windows":
                                        [0.99 * t, t, 1.01 * t]})
    return measure


def test_parse_param():
    from monitor.cli.args import parse_param

    assert parse_param("num_workers=0,1,2,4") == ("num_workers", [0, 1, 2, 4])
    assert parse_param("pin-memory=off,on") == ("pin_memory", [False, True])
    assert parse_param("batch_size=32,32,64") == ("batch_size", [32, 64])
    for bad in ("num_workers", "workers=1,2", "num_workers=a", "pin_memory=maybe"):
        with pytest.raises(ValueError, match="--param"):
            parse_param(bad)


def test_grid_collapses_settings_that_do_not_apply():
    configs = grid(BASE, {"num_workers": [0, 1, 2], "prefetch_factor": [1, 2, 4]})
    assert len(configs) == 1 + 2 * 3
    zero = [c for c in configs if c.num_workers == 0]
    assert len(zero) == 1 and zero[0].prefetch_factor is None


def test_knee_names_the_cheapest_near_the_best():
    results = [ConfigResult(BASE.replace(num_workers=n), throughput=t, peak_memory_mb=300 + 210 * n)
               for n, t in [(0, 190), (1, 300), (2, 470), (3, 480), (4, 490)]]
    k = find_knee(results)
    assert k.best.config.num_workers == 4 and k.knee.config.num_workers == 3
    assert "num_workers=3" in k.text and "reaches 98%" in k.text
    assert "+1 process" in k.text and "+210 MB" in k.text
    solo = find_knee(results[:3])
    assert solo.knee is solo.best and "nothing cheaper" in solo.text
    assert find_knee([ConfigResult(BASE, status="skipped")]) is None


def test_memory_prediction_skips_configs_that_would_not_fit():
    seen = [ConfigResult(BASE.replace(num_workers=0), throughput=1, peak_memory_mb=400),
            ConfigResult(BASE.replace(num_workers=2), throughput=1, peak_memory_mb=1000)]
    assert memory_fits(BASE.replace(num_workers=3), seen, 2000) is None
    why = memory_fits(BASE.replace(num_workers=8), seen, 2000)
    assert why and "300 MB per worker" in why
    assert memory_fits(BASE.replace(num_workers=8), [], 2000) is None


def test_sweep_skips_and_cancels():
    log: list = []
    configs = grid(BASE, {"num_workers": [0, 1, 2, 3, 4]})
    state = run_sweep(configs, fake_measure("starving", log), available_mb=1000)
    assert [r.status for r in state.results] == ["ok", "ok", "ok", "skipped", "skipped"]
    assert state.done and len(log) == 3
    cancel = threading.Event()

    def measure_then_cancel(cfg):
        cancel.set()
        return fake_measure("starving", [])(cfg)

    state = run_sweep(configs, measure_then_cancel, cancel=cancel)
    assert len(state.results) == 1 and state.done


@pytest.mark.parametrize("kind", ["starving", "io-bound", "cpu-bound"])
def test_autotune_finds_near_best_in_a_third_of_the_grid(kind):
    """Grids to 3x the cores of a 2-core machine (0..6 workers x prefetch 1, 2, 4)."""
    configs = grid(BASE, {"num_workers": list(range(7)), "prefetch_factor": [1, 2, 4]})
    thr = surface(kind)
    best = max(thr(c) for c in configs)
    log: list = []
    state = autotune(BASE, fake_measure(kind, log), 6)
    assert state.best["throughput"] >= 0.95 * best
    assert state.best["settled"].startswith("settled at")
    assert len(log) <= 0.35 * len(configs), [c.num_workers for c in log]
    assert len(set(log)) == len(log)  # nothing measured twice


def test_autotune_respects_the_time_budget():
    t = [0.0]

    def slow(cfg):
        t[0] += 10.0
        return fake_measure("io-bound", [])(cfg)

    state = autotune(BASE, slow, 6, budget_s=15.0, clock=lambda: t[0])
    assert len(state.results) == 2 and state.best is not None


def test_autotune_without_a_prediction_still_climbs():
    log: list = []

    def blind(cfg):  # no advice at all: the policy climbs a worker at a time
        return dataclasses.replace(fake_measure("starving", log)(cfg), advised_workers=None,
                                   assessment=None)

    state = autotune(BASE, blind, 6)
    assert state.best["config"]["num_workers"] == 2
    assert [c.num_workers for c in log][:4] == [0, 1, 2, 3]
    assert isinstance(state, SweepState) and state.error is None


def test_autotune_does_not_climb_when_the_cores_are_saturated():
    """Started where the diagnosis finds the cores full: nothing to try (no worker more, no
    deeper prefetch), so one run and done."""
    log: list = []
    state = autotune(BASE.replace(num_workers=2), fake_measure("cpu-bound", log), 6)
    assert [c.num_workers for c in log] == [2]
    assert state.best["config"]["num_workers"] == 2 and "no candidate" in state.best["settled"]


def test_autotune_climbs_one_step_past_full_cores_while_the_measured_gain_pays():
    """The model calls 2 workers cores-bound, but the move there paid: one more step is
    measured, and the search stops at the first step that does not pay."""
    log: list = []
    state = autotune(BASE, fake_measure("cpu-bound", log), 6)
    assert [c.num_workers for c in log] == [0, 2, 3]
    assert state.best["config"]["num_workers"] == 2


def test_autotune_reverts_a_failed_run_and_goes_on_from_the_best():
    log: list = []

    def oom_at_five(cfg):
        r = fake_measure("io-bound", log)(cfg)
        if cfg.num_workers == 5:
            return dataclasses.replace(r, status="failed", throughput=None,
                                       reason="workload process killed by signal 9 (SIGKILL)")
        return r

    state = autotune(BASE, oom_at_five, 6)
    failed = [m for m in state.best["moves"] if m["failed"]]
    assert failed and "SIGKILL" in failed[0]["failed"] and not failed[0]["kept"]
    assert state.best["config"]["num_workers"] != 5 and state.best["throughput"] > 165
