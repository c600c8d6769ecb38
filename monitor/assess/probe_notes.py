"""What the attach probe says of itself, read from a run's `probe` events (written by
monitor/probe/recorder.py and monitor/probe/patch.py): timing or recording that stopped (the
probe's own failure: the training went on untouched), and a timed loader that requested
settings cannot reach. The run's JSON, its summary and the page read them here."""
from __future__ import annotations

import json
from typing import Any

from monitor.records import PROBE

NO_LOADER = ("no torch DataLoader was iterated by this script; to time another iterator use "
             "`from monitor import watch` and `for batch in watch(your_iterator): ...`")


def _rows(events: Any) -> list[tuple[str, dict[str, Any]]]:
    if events is None or events.empty:
        return []
    ev = events[events["kind"] == PROBE]
    return [(str(label), json.loads(raw) if isinstance(raw, str) else {})
            for label, raw in zip(ev["label"], ev["data"], strict=True)]


def timing_stopped(events: Any) -> dict[str, Any] | None:
    """The first stop the probe recorded: what stopped, where, the error, the step."""
    for label, data in _rows(events):
        if data.get("stopped"):
            return {"what": data["stopped"], "loader": data.get("loader"),
                    "where": data.get("where"), "error": data.get("error") or label,
                    "at_step": data.get("at_step"), "text": label}
    return None


def retune(events: Any) -> dict[str, Any]:
    """Whether loader requests can reach the timed loader, and why not."""
    for _label, data in _rows(events):
        if data.get("retunable") is False:
            return {"possible": False, "why": data.get("why")}
    return {"possible": True, "why": None}


def no_loader_text(events: Any) -> str | None:
    """For a run with no steps: why none were timed (None when a loader was timed)."""
    rows = _rows(events)
    if any(label.startswith("timing ") for label, _ in rows):
        return None
    skipped = [label for label, _ in rows if label.startswith("not timed:")]
    return f"no DataLoader was timed: {skipped[0][len('not timed: '):]}" if skipped \
        else NO_LOADER
