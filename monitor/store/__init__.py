"""The SQLite store: the only channel between the workload, the collector and the page. One
part per table over one file, its schema, its errors; WAL, batched writes."""
from __future__ import annotations

from monitor.store.core import (
    ATTACHED,
    CALIBRATION_MAX_AGE_S,
    DEFAULT_PATH,
    ENV_VAR,
    FAILED,
    FINISHED,
    MANAGED,
    RUN_KINDS,
    RUN_STATUSES,
    RUNNING,
    STOPPED,
    Store,
    default_path,
)
from monitor.store.errors import StoreError, explain

__all__ = ["ATTACHED", "CALIBRATION_MAX_AGE_S", "DEFAULT_PATH", "ENV_VAR", "FAILED", "FINISHED",
           "MANAGED", "RUN_KINDS", "RUN_STATUSES", "RUNNING", "STOPPED", "Store",
           "StoreError", "default_path", "explain"]
