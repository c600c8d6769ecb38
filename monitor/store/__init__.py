"""The SQLite store: the only channel between the workload, the collector and the page.
core.py composes one part per table (runs.py, series.py, rollups.py, control.py, meta.py,
retention.py) over one file (db.py); schema.py is the schema, errors.py its errors."""
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
