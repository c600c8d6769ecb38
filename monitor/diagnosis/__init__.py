"""Why the device starves, what limits throughput and what to change: pure functions from a
window's measured features to a verdict, the causes found, the bound (whose model and
equations bound.py's docstring states) and ordered advice. Thresholds live in
monitor/thresholds.py; monitor/assess/window.py is the one caller that puts them together.
"""
from __future__ import annotations

from monitor.diagnosis.bound import BoundModel, best_workers, fit_bound, loading_latency
from monitor.diagnosis.features import (
    SIMULATED,
    Features,
    evidence_rows,
    features,
    workload_memory,
)
from monitor.diagnosis.finding import Advice, Diagnosis
from monitor.diagnosis.rules import (
    CORES_BOUND,
    HEALTHY,
    NO_DATA,
    STARVING,
    VERDICTS,
    diagnose,
)

__all__ = ["CORES_BOUND", "HEALTHY", "NO_DATA", "SIMULATED", "STARVING", "VERDICTS", "Advice",
           "BoundModel", "Diagnosis", "Features", "best_workers", "diagnose", "evidence_rows",
           "features", "fit_bound", "loading_latency", "workload_memory"]
