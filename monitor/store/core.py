"""The SQLite store: the only channel between the workload, the collector and the page.

A Store is made of one part per table it owns, over one file (db.py: a connection per
thread, WAL mode, the schema): runs.py (`runs`, `ranks`), series.py (steps, host, GPU rows,
events), rollups.py (`step_seconds`), control.py (`control`), meta.py (`meta`,
`calibration`, `gpu_devices`) and retention.py (what is kept), each a class whose methods
the Store inherits under the names callers use; notes.py (failure reasons that could not
be written into the file, beside it) and db.py are held.
"""
from __future__ import annotations

import os
from pathlib import Path

from monitor.store.control import Control
from monitor.store.db import Db
from monitor.store.meta import CALIBRATION_MAX_AGE_S, Meta
from monitor.store.notes import Notes
from monitor.store.retention import Retention
from monitor.store.rollups import Rollups
from monitor.store.runs import (
    ATTACHED,
    FAILED,
    FINISHED,
    MANAGED,
    RUN_KINDS,
    RUN_STATUSES,
    RUNNING,
    STOPPED,
    Runs,
)
from monitor.store.series import Series

DEFAULT_PATH = Path("runs") / "monitor.db"
ENV_VAR = "STARVATION_MONITOR_DB"

__all__ = ["ATTACHED", "CALIBRATION_MAX_AGE_S", "DEFAULT_PATH", "ENV_VAR", "FAILED", "FINISHED",
           "MANAGED", "RUN_KINDS", "RUN_STATUSES", "RUNNING", "STOPPED", "Store",
           "default_path"]


def default_path() -> Path:
    """The store's path: $STARVATION_MONITOR_DB, else runs/monitor.db."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


class Store(Runs, Series, Rollups, Control, Meta, Retention):
    """Thread-safe access to one SQLite file (a connection per thread). Its methods are its
    parts' own (each part a class of one module, over `self.db`): go-to-definition lands on
    the code."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        """Open (or create) the store; StoreError, with nothing left behind, when the path
        cannot be one."""
        self.path = Path(path) if path is not None else default_path()
        self.db = Db(self.path)
        self.notes = Notes(self.path)
        self.notes.reserve()

    # the file (db.py)
    def check(self) -> None:
        """Db.check: StoreError when the file was deleted or replaced since it was opened."""
        self.db.check()

    def close(self) -> None:
        """Db.close: this thread's connection."""
        self.db.close()

    def size_bytes(self) -> int:
        """Db.size_bytes: the file with its WAL."""
        return self.db.size_bytes()

    # reasons that could not be written here (notes.py)
    def note_failure(self, run_id: int, reason: str) -> bool:
        """Notes.add: a run's failure reason, beside the file; False when even this could
        not be written."""
        return self.notes.add(run_id, reason)
