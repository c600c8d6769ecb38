"""The SQLite store: the only channel between the workload, the collector and the page
(core.py); its schema (schema.py) and its errors (errors.py)."""
from __future__ import annotations

from monitor.store.core import (
    CALIBRATION_MAX_AGE_S,
    DEFAULT_PATH,
    ENV_VAR,
    RUN_STATUSES,
    Store,
    default_path,
)
from monitor.store.errors import StoreError, explain

__all__ = ["CALIBRATION_MAX_AGE_S", "DEFAULT_PATH", "ENV_VAR", "RUN_STATUSES", "Store",
           "StoreError", "default_path", "explain"]
