"""The page's and measure's reading of the stall watchdog's events (monitor/probe/watchdog.py
writes them)."""
from __future__ import annotations

import json
import time
from typing import Any

from monitor.records import LOOP_ENDED, RESUMED, STALL_KINDS, STALLED

__all__ = ["LOOP_ENDED", "STALL_KINDS", "active_stall", "stuck_at_end"]


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
    what = "no first batch after" if label.startswith("no first batch") else "no batch for"
    return f"{what} {idle:.0f} s" + label[label.index(":"):] if ":" in label else label


def stuck_at_end(events: Any) -> str | None:
    """What the watchdog said of a stall that never saw batches again (the process ended in
    it: killed, interrupted, crashed), else None."""
    if events is None or events.empty:
        return None
    ev = events[events["kind"].isin([STALLED, RESUMED])]
    stalls = ev.index[ev["kind"] == STALLED]
    if not len(stalls):
        return None
    after = ev.loc[stalls[-1]:]
    resumed = after[(after["kind"] == RESUMED) & (after["label"] != LOOP_ENDED)]
    return None if len(resumed) else str(ev.loc[stalls[-1], "label"])
