"""Predictions checked against outcomes: each applied change that came with a predicted
throughput (the page's Apply of the first advice, a live autotune move from the bound model)
beside what the setting then measured. `outcomes()` and `fold()` are pure; `of_run` and
`state_of` read the store (of_run keeps final outcomes for the page's ticks); the one writer
of the learnt scales is monitor/manage/context.py's `learn`.

A prediction is an event whose data holds `predicted` (samples/s) and the settings asked for.
Its outcome is the first loader generation (`config_seq`) that ran after a config event with
those settings: its throughput, samples / Σ(wait + compute), over its steps after its start-up
(the batches in flight, at least two steps), when at least OUTCOME_MIN_STEPS are left, at
most OUTCOME_MAX_STEPS (both in monitor/thresholds.py). An outcome is final once it has
OUTCOME_MAX_STEPS or its generation has ended; the page reads each prediction's steps until
then, and never again.
"""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pandas as pd

from monitor.caching import Bounded
from monitor.config import LIVE_SETTINGS, in_flight
from monitor.frames.analysis import loop_rate, rank_rows
from monitor.records import CONFIG
from monitor.thresholds import (
    OUTCOME_MAX_STEPS,
    OUTCOME_MIN_STEPS,
    OUTCOME_SCALE_MEMORY,
    OUTCOME_SCALE_RANGE,
)

if TYPE_CHECKING:
    from monitor.store import Store

SCALE_KEY = "prediction_scales"  # meta: {limit: {"scale": s, "n": outcomes learnt from}}
SPAN_S = 300.0  # how long after the last prediction its setting's steps are read
ADVICE = "advice"  # the event kind of an advice applied from the page


def _data(x: Any) -> dict[str, Any]:
    if isinstance(x, dict):
        return x
    try:
        d = json.loads(x) if isinstance(x, str) else None
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _matches(config: dict[str, Any], target: dict[str, Any]) -> bool:
    return all(config.get(k) == v for k, v in target.items())


def outcomes(events: pd.DataFrame, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """[{change, source, predicted, measured, error, steps}] in the order they were applied;
    `measured` None (and `error` None) while the setting has run fewer than OUTCOME_MIN_STEPS."""
    if events.empty or "data" not in events.columns:
        return []
    ev = events.assign(d=events["data"].map(_data)).sort_values("ts")
    configs = ev[ev["kind"] == CONFIG]
    out: list[dict[str, Any]] = []
    for _, e in ev.iterrows():
        d = e["d"]
        if d.get("predicted") is None or d.get("revert"):
            continue
        target = {k: d[k] for k in LIVE_SETTINGS if k in d}
        if not target:
            continue
        rank = d.get("rank")
        row = {"change": str(e["label"]), "source": str(e["kind"]),
               "predicted": float(d["predicted"]), "limit": d.get("limit"),
               "measured": None, "error": None, "steps": 0, "final": False}
        out.append(row)
        applied = configs[(configs["ts"] >= e["ts"])
                          & configs["d"].map(lambda c, t=target: _matches(c, t))]
        if applied.empty or steps.empty:
            continue
        s = steps[steps["ts"] > float(applied["ts"].iloc[0])]
        if rank is not None and "rank" in s.columns and s["rank"].nunique() > 1:
            s = rank_rows(s, rank)
        if s.empty:
            continue
        ended = False
        if "config_seq" in s.columns:
            first = s["config_seq"].min()
            ended = bool((s["config_seq"] > first).any())
            s = s[s["config_seq"] == first]
        skip = max(2, in_flight(target))
        s = s.iloc[skip:skip + OUTCOME_MAX_STEPS]
        row["steps"] = len(s)
        row["final"] = ended or len(s) == OUTCOME_MAX_STEPS
        rate = loop_rate(s)
        if len(s) >= OUTCOME_MIN_STEPS and rate > 0:
            row["measured"] = rate
            row["error"] = row["predicted"] / row["measured"] - 1
    return out


# (store, run, event id) -> a final outcome (no more steps can change it)
_FINAL: Bounded[tuple[str, int, int], dict[str, Any]] = Bounded(10_000)


def _predicts(data: Any) -> bool:
    """Does an event's stored data carry a prediction (a number under "predicted")?"""
    if not isinstance(data, str) or not data:
        return False
    try:
        got = json.loads(data)
    except ValueError:
        return False
    return isinstance(got, dict) and isinstance(got.get("predicted"), int | float) and \
        not isinstance(got.get("predicted"), bool)


def of_run(store: Store, run_id: int) -> list[dict[str, Any]]:
    """A run's outcomes, from its events and, for each prediction, its steps within SPAN_S
    (the page asks every second: a final outcome is kept, not read again)."""
    ev = store.events(run_id, kinds=(CONFIG, "autotune", ADVICE))
    has = ev["data"].map(_predicts).astype(bool) if not ev.empty else None
    if has is None or not has.any():
        return []
    configs, out = ev[ev["kind"] == CONFIG], []
    for i in ev.index[has]:
        key = (str(store.path), run_id, int(ev.at[i, "id"]) if "id" in ev.columns else i)
        row = _FINAL.get(key)
        if row is None:
            t = float(ev.at[i, "ts"])
            got = outcomes(pd.concat([ev.loc[[i]], configs]),
                           store.steps(run_id, since=t, until=t + SPAN_S))
            if not got:
                continue
            row = got[0]
            if row["final"] or time.time() > t + SPAN_S:  # no more steps can count
                _FINAL.put(key, row)
        out.append(row)
    return out


def state_of(store: Store) -> dict[str, dict[str, float]]:
    """The store's scales as kept: limit -> {"scale": s, "n": outcomes learnt from}."""
    try:
        got = json.loads(store.meta(SCALE_KEY) or "{}")
    except (ValueError, TypeError):
        return {}
    return {k: v for k, v in got.items() if isinstance(v, dict)} if isinstance(got, dict) \
        else {}


def scale_of(store: Store) -> dict[str, float]:
    """This machine's measured / predicted for a change of setting, by the bound model's
    limit at the setting predicted ("device", "workers", "cores"), from its store; a limit
    with no measured outcome is not in it (its scale is 1)."""
    return {k: float(v.get("scale", 1.0)) for k, v in state_of(store).items()}


def fold(state: dict[str, dict[str, float]],
         rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The machine's scales (`state`: limit -> {scale, n}, as `state_of` reads them) with a
    run's measured outcomes folded in. Their predictions were made with the scale of their
    time, so each outcome's measured / predicted is what is still off: its limit's scale
    moves by it, a running mean over about OUTCOME_SCALE_MEMORY outcomes (the first one corrects
    fully). Outcomes whose limit is unknown teach nothing."""
    scales = {k: dict(v) for k, v in state.items()}
    lo, hi = OUTCOME_SCALE_RANGE
    for r in rows:
        if not (r.get("measured") and r.get("predicted") and r.get("limit")):
            continue
        k = scales.setdefault(str(r["limit"]), {"scale": 1.0, "n": 0})
        off = min(hi, max(lo, r["measured"] / r["predicted"]))
        k["n"] = n = int(k.get("n", 0)) + 1
        k["scale"] = round(min(hi, max(lo, float(k.get("scale", 1.0))
                                       * (1 + (off - 1) / min(n, OUTCOME_SCALE_MEMORY)))), 4)
    return scales


def error_line(rows: list[dict[str, Any]]) -> str | None:
    """'predicted vs measured over 3 applied changes: mean |error| 12%, 3 high, 0 low'."""
    done = [r for r in rows if r["error"] is not None]
    if not done:
        return None
    mean = sum(abs(r["error"]) for r in done) / len(done)
    high = sum(r["error"] > 0 for r in done)
    return (f"predicted vs measured over {len(done)} applied change"
            f"{'s' if len(done) != 1 else ''}: mean |error| {mean:.0%}, {high} high, "
            f"{len(done) - high} low")
