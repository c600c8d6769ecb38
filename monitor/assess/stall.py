"""The page's and measure's reading of the stall watchdog's events (monitor/probe/watchdog.py
writes them)."""
from __future__ import annotations

import json
import time
from typing import Any

from monitor.records import RESUMED, STALL_KINDS, STALLED

__all__ = ["STALL_KINDS", "active_stall"]


def active_stall(events: Any, now: float | None = None) -> str | None:
    """The page's line while a stall lasts: 'no batch for 14 s: the loader looks stuck; ...'
    from the run's events frame (None when the last stall has resumed)."""
    if events is None or events.empty:
        return None
    ev = events[events["kind"].isin([STALLED, RESUMED])]
    if ev.empty or ev["kind"].iloc[-1] != STALLED:
        return None
    data = json.loads(ev["data"].iloc[-1] or "{}")
    label = str(ev["label"].iloc[-1])
    since = data.get("waiting_since")
    if since is None:
        return label
    idle = (now if now is not None else time.time()) - float(since)
    return f"no batch for {idle:.0f} s" + label[label.index(":"):] if ":" in label else label
