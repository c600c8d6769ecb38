"""The SQLite store: the only channel between the workload, the collector and the page.
core.py composes one part per table (runs.py, series.py, rollups.py, control.py, meta.py,
retention.py) over one file (db.py); schema.py is the schema, errors.py its errors."""
from __future__ import annotations

from monitor.store.core import (
    CALIBRATION_MAX_AGE_S,
    DEFAULT_PATH,
    ENV_VAR,
    RUN_STATUSES,
    RUNNING,
    Store,
    default_path,
)
from monitor.store.errors import StoreError, explain

__all__ = ["CALIBRATION_MAX_AGE_S", "DEFAULT_PATH", "ENV_VAR", "RUN_STATUSES", "RUNNING", "Store",
           "StoreError", "default_path", "explain"]
