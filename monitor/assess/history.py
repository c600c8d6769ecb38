"""A run's own history: each loader generation (`config_seq`, one per applied setting) with
its settings and what it measured, for findings that compare settings the run has already
tried ("more workers made it slower"). The generation now running is the window's; those
that ended do not change and are read once from the store (one query each)."""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pandas as pd

from monitor.config import LIVE_SETTINGS, in_flight
from monitor.records import CONFIG
from monitor.thresholds import HISTORY_FINAL_S, HISTORY_SKIP_STEPS

if TYPE_CHECKING:
    from monitor.store import Store

_DONE: dict[tuple[str, int, int | None, int], dict[str, Any]] = {}


def _data(x: Any) -> dict[str, Any]:
    try:
        d = json.loads(x) if isinstance(x, str) else x
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def config_events(events: pd.DataFrame | None, rank: int | None = None,
                  ) -> list[tuple[float, dict[str, Any], str]]:
    """(ts, settings, label) of each `config` event of one rank, in order: the one at index
    i opened generation `config_seq` i (the probe counts one per applied change)."""
    if events is None or events.empty or "kind" not in events.columns:
        return []
    cfg = events[events["kind"] == CONFIG].sort_values("ts")
    rows = [(float(t), _data(d), str(x)) for t, d, x in
            zip(cfg["ts"], cfg["data"], cfg["label"], strict=True)]
    return [r for r in rows if rank is None or r[1].get("rank") in (None, rank)]


def unrecorded_change(events: pd.DataFrame | None, seq: int, rank: int | None = None,
                      ) -> tuple[dict[str, Any], str] | None:
    """Where the last steps are of generation `seq` and later changes recorded none (applied
    just before the run ended): (generation seq's settings, the last change's label)."""
    rows = config_events(events, rank)
    if not 0 <= seq < len(rows) - 1:
        return None
    settings = {k: rows[seq][1][k] for k in LIVE_SETTINGS if k in rows[seq][1]}
    return (settings, rows[-1][2]) if settings else None


def generations(store: Store, run_id: int, events: pd.DataFrame,
                rank: int | None = None) -> tuple[dict[str, Any], ...]:
    """[{seq, settings, steps, samples, loop_s, throughput}] of the generations that ended,
    in order (their first steps, the workers' start and the queue's filling, left out)."""
    rows = [(t, d) for t, d, _ in config_events(events, rank)]
    out, now = [], time.time()
    for seq, ((ts, d), (nxt, _)) in enumerate(zip(rows[:-1], rows[1:], strict=True)):
        key = (str(store.path), run_id, rank, seq)
        row = _DONE.get(key)
        if row is None:
            skip = max(HISTORY_SKIP_STEPS, in_flight(d))
            t = store.generation_total(run_id, seq, ts - 1.0, nxt + 1.0, rank, skip)
            row = {"seq": seq, "settings": {k: d.get(k) for k in LIVE_SETTINGS}, **t,
                   "throughput": t["samples"] / t["loop_s"] if t["loop_s"] > 0 else None}
            if now > nxt + HISTORY_FINAL_S:  # its last steps are in the store: final
                if len(_DONE) > 10_000:
                    _DONE.clear()
                _DONE[key] = row
        out.append(row)
    return tuple(out)
