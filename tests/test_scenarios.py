"""The labelled scenario suite: short managed runs, each with the verdict it must get.

Settings are chosen with clear margins for a noisy 2-core machine (e.g. `starving` at two
workers uses a longer step so that two loaders keep up with room to spare); the presets' own
figures are measured by bench/presets.py, not asserted here.
"""
from __future__ import annotations

import pytest

from monitor.config import LoaderConfig
from monitor.measure import measure

pytestmark = pytest.mark.slow

SCENARIOS = [
    ("starving@0", dict(preset="starving", num_workers=0), None, "starving"),
    ("starving@2", dict(preset="starving", num_workers=2, step_time_ms=150.0), None,
     "healthy"),
    ("cpu-bound@2", dict(preset="cpu-bound", num_workers=2), None, "cpu-bound"),
    ("io-bound@0", dict(preset="io-bound", num_workers=0), None, "io-bound"),
    ("healthy@0", dict(preset="healthy", num_workers=0), None, "healthy"),
    ("cpu-bound@4", dict(preset="cpu-bound", num_workers=4), None, "oversubscribed"),
    ("short epochs, workers restarted", dict(preset="healthy", num_workers=2,
                                             step_time_ms=20.0, epoch_samples=256),
     None, "epoch-stall"),
    ("memory-heavy, small budget", dict(preset="memory-heavy", num_workers=2,
                                        prefetch_factor=4), 600.0, "memory-pressure"),
]


@pytest.mark.parametrize(("name", "settings", "budget", "expected"), SCENARIOS,
                         ids=[s[0] for s in SCENARIOS])
def test_scenario_verdict(store, no_leaks, name, settings, budget, expected):
    cfg = LoaderConfig.build(**settings)
    m = measure(store, cfg, 6.0, memory_budget_mb=budget)
    assert m.status == "stopped", m.error
    dg = m.diagnosis
    assert dg is not None
    ev = dg.evidence
    detail = (f"{name}: got {dg.verdict} ({dg.headline}); share {ev['data_wait_share']:.2f}, "
              f"cpu {ev.get('cpu_busy_fraction')}, io {ev.get('loading_cpu_per_wall')}, "
              f"mem {ev.get('memory_fraction')}, stall {ev.get('epoch_stall_share')}")
    print(detail)
    assert dg.verdict == expected, detail
    if expected == "cpu-bound":
        assert all(a.param != "num_workers" for a in dg.advice)
