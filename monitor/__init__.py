"""Starvation Monitor: shows, per step, whether a GPU is starved by its input pipeline."""
from __future__ import annotations

import sys
from typing import Any

__version__ = "0.1.0"


def watch(loader: Any, name: str | None = None) -> Any:
    """`for batch in watch(loader): ...` records this epoch's data wait and compute per step
    to the store (see monitor.probe.patch)."""
    from monitor.probe.patch import watch as _watch

    it = _watch(loader, name)
    _in_cells(name, now=True)  # this cell's, at once: its epoch began before the hook was there
    return it


def _in_cells(name: str | None, now: bool = False) -> None:
    """In a Jupyter kernel, the run live in the cell that trains (monitor/notebook.py), from
    the next epoch's start (a callback made in one cell and fitted in another), or `now`."""
    if "ipykernel" in sys.modules:
        from monitor.notebook import follow_in_cells, live
        from monitor.probe.patch import recorder

        rec = recorder(name)
        follow_in_cells(rec)
        if now:
            live(rec)


def show(run_id: int, db: str | None = None) -> None:
    """Show a run in this notebook cell: its line, its last window's verdict and advice."""
    from monitor.notebook import show as _show

    _show(run_id, db)


def lightning_callback(name: str | None = None) -> Any:
    """A Lightning Callback recording the fit loop's steps (monitor.probe.frameworks)."""
    from monitor.probe.frameworks import lightning_callback as make

    cb = make(name)
    _in_cells(name)
    return cb


def hf_callback(name: str | None = None) -> Any:
    """A Hugging Face TrainerCallback recording the Trainer's steps (monitor.probe.frameworks)."""
    from monitor.probe.frameworks import hf_callback as make

    cb = make(name)
    _in_cells(name)
    return cb


def fastai_callback(name: str | None = None) -> Any:
    """A fastai Callback recording Learner.fit's steps (monitor.probe.frameworks)."""
    from monitor.probe.frameworks import fastai_callback as make

    cb = make(name)
    _in_cells(name)
    return cb
