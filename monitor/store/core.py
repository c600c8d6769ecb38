"""The SQLite store: the only channel between the workload, the collector and the page.

A Store is composed of one part per table it owns, over one file (db.py: a connection per
thread, WAL mode, the schema): runs.py (`runs`, `ranks`), series.py (steps, host, GPU rows,
events), rollups.py (`step_seconds`), control.py (`control`), meta.py (`meta`,
`calibration`, `gpu_devices`), retention.py (what is kept) and notes.py (failure reasons
that could not be written into the file, beside it). Its methods are those parts'
methods under the names callers use; each line below says which part owns one.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


class _Part:
    """A Store method that is a part's method: `create_run = _Part("run_table",
    Runs.create)` binds Runs.create to the store's `run_table`, docstring and all."""

    def __init__(self, part: str, func: Callable[..., Any]) -> None:
        self.part, self.func, self.__doc__ = part, func, func.__doc__

    def __get__(self, store: Any, owner: type | None = None) -> Any:
        if store is None:
            return self
        return self.func.__get__(getattr(store, self.part))


class Store:
    """Thread-safe access to one SQLite file (a connection per thread)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        """Open (or create) the store; StoreError, with nothing left behind, when the path
        cannot be one."""
        self.path = Path(path) if path is not None else default_path()
        self.db = Db(self.path)
        self.notes = Notes(self.path)
        self.notes.reserve()
        self.run_table = Runs(self.db, self.notes)
        self.series = Series(self.db)
        self.rollups = Rollups(self.db)
        self.control = Control(self.db)
        self.meta_table = Meta(self.db)
        self.retention = Retention(self.db)

    # the file (db.py)
    check = _Part("db", Db.check)
    close = _Part("db", Db.close)
    size_bytes = _Part("db", Db.size_bytes)
    # runs and ranks (runs.py)
    create_run = _Part("run_table", Runs.create)
    update_run = _Part("run_table", Runs.update)
    finish_run = _Part("run_table", Runs.finish)
    close_orphans = _Part("run_table", Runs.close_orphans)
    import_run = _Part("run_table", Runs.import_)
    runs = _Part("run_table", Runs.list)
    run = _Part("run_table", Runs.get)
    live_state = _Part("run_table", Runs.live_state)
    resolve_run = _Part("run_table", Runs.resolve)
    previous_run = _Part("run_table", Runs.previous)
    job_run = _Part("run_table", Runs.job_run)
    set_rank = _Part("run_table", Runs.set_rank)
    ranks = _Part("run_table", Runs.ranks)
    # time series and events (series.py), their rollup (rollups.py)
    insert = _Part("series", Series.insert)
    insert_rows = _Part("series", Series.insert_rows)
    add_event = _Part("series", Series.add_event)
    events = _Part("series", Series.events)
    steps = _Part("series", Series.steps)
    first_steps = _Part("series", Series.first_steps)
    rank_totals = _Part("series", Series.rank_totals)
    last_step_ts = _Part("series", Series.last_step_ts)
    generation_total = _Part("series", Series.generation_total)
    host_samples = _Part("series", Series.host_samples)
    gpu_samples = _Part("series", Series.gpu_samples)
    gpu_util = _Part("series", Series.gpu_util)
    roll_up = _Part("rollups", Rollups.roll_up)
    step_seconds = _Part("rollups", Rollups.step_seconds)
    # control requests (control.py)
    request_control = _Part("control", Control.request)
    pending_control = _Part("control", Control.pending)
    control_after = _Part("control", Control.after)
    mark_control = _Part("control", Control.mark)
    control_requests = _Part("control", Control.requests)
    control_result = _Part("control", Control.result)
    # small shared state (meta.py)
    meta = _Part("meta_table", Meta.get)
    set_meta = _Part("meta_table", Meta.set)
    calibration = _Part("meta_table", Meta.calibration)
    calibration_with_age = _Part("meta_table", Meta.calibration_with_age)
    set_calibration = _Part("meta_table", Meta.set_calibration)
    set_gpu_inventory = _Part("meta_table", Meta.set_gpu_inventory)
    gpu_inventory = _Part("meta_table", Meta.gpu_inventory)
    # reasons that could not be written here (notes.py)
    note_failure = _Part("notes", Notes.add)
    # what is kept (retention.py)
    gc = _Part("retention", Retention.gc)
    integrity_ok = _Part("retention", Retention.integrity_ok)
