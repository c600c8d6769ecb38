"""Why the device starves, what limits throughput, and what to change: pure functions over
the store's frames. features.py measures a window, bound.py models it (its docstring states
the equations), rules.py names the verdict and orders advice, thresholds.py holds every
threshold. monitor/assess/window.py is the one caller that puts them together.
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
from monitor.diagnosis.rules import (
    CORES_BOUND,
    HEALTHY,
    NO_DATA,
    STARVING,
    VERDICTS,
    Advice,
    Diagnosis,
    diagnose,
)

__all__ = ["CORES_BOUND", "HEALTHY", "NO_DATA", "SIMULATED", "STARVING", "VERDICTS", "Advice",
           "BoundModel", "Diagnosis", "Features", "best_workers", "diagnose", "evidence_rows",
           "features", "fit_bound", "loading_latency", "workload_memory"]
