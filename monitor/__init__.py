"""Starvation Monitor: shows, per step, whether a GPU is starved by its input pipeline."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def watch(loader: Any, name: str | None = None) -> Any:
    """`for batch in watch(loader): ...` records this epoch's data wait and compute per step
    to the store (see monitor.attach)."""
    from monitor.attach import watch as _watch

    return _watch(loader, name)
