"""When the page redraws what (no streamlit, no store): how often the live region of the
page's own run refreshes, and which charts a refresh sends again as drawn (a figure sent
unchanged costs the browser no redraw). The page (ui/app.py) asks; ui/view.py reads."""
from __future__ import annotations

from typing import Any

import pandas as pd

from monitor.records import CONFIG

# The page's own live run refreshes every FRESH_REFRESH_S for FRESH_S after it starts or its
# settings change (a slider, Apply, Auto-tune: the effect shows at once), then every
# STEADY_REFRESH_S: a refresh costs the server ~45 ms of CPU, and at one a second a tab took
# 0.08 core of the cores the workload runs on (bench/ui_tick.py --soak).
FRESH_REFRESH_S, STEADY_REFRESH_S, FRESH_S = 1.0, 2.0, 20.0
# a watched job's page is read every WATCH_REFRESH_S, and every WATCH_FIRST_S while it is
# young and has no verdict yet: its first verdict shows within a second of its first steps
# (bench/first_verdict_page.py)
WATCH_REFRESH_S, WATCH_FIRST_S = 2.0, 0.5


def live_period(run: dict, events: pd.DataFrame, now: float) -> float:
    """How often the live region of the page's own run refreshes now."""
    last = float(run.get("started_at") or 0.0)
    if events is not None and not events.empty and "kind" in events.columns:
        changes = events.loc[events["kind"] == CONFIG, "ts"]
        if len(changes):
            last = max(last, float(changes.max()))
    return FRESH_REFRESH_S if now - last < FRESH_S else STEADY_REFRESH_S


SECONDARY_CHARTS = ("chart_thr", "chart_wait", "chart_host", "chart_phases")
# a watched job's secondary charts, and a steady run's of the page's own, are redrawn this
# often: the tab's CPU on the default live workload, interleaved 30 s each, 0.343 and 0.347
# core redrawn every refresh, 0.271 and 0.284 held (2026-12-03; bench/ui_tick.py --soak
# prints the browser's CPU)
SECONDARY_HOLD_S = 6.0
# while the run is young or just changed the secondary charts are redrawn at every other
# refresh (a change itself redraws them at once): the tab's CPU over the first 15 s,
# interleaved, 0.72, 0.60, 0.69 core every refresh against 0.57, 0.46, 0.60
FRESH_HOLD_S = 1.5


def held_figures(state: dict[str, Any], key: Any, figs: dict, now: float,
                 hold_s: float = SECONDARY_HOLD_S) -> dict:
    """The figures to draw: the main picture always new; the secondary charts as drawn
    last unless they are `hold_s` old or the view changed (`key`: run, window, rank,
    settings). A figure sent again unchanged costs the browser no redraw;
    redrawing the three took Chromium about 0.5 s of CPU each time on the 2-core box
    (docs/guide.md: watching costs the job little)."""
    held = state.get("held")
    if held is None or held["key"] != key or now - held["at"] >= hold_s:
        state["held"] = {"key": key, "at": now,
                         "figs": {k: figs[k] for k in SECONDARY_CHARTS if k in figs}}
        return figs
    return {**figs, **held["figs"]}


def drawn_figures(state: dict[str, Any], key: Any, figs: dict, now: float, watching: bool,
                  period: float | None) -> dict:
    """What a refresh draws: the main picture new at every refresh; the secondary charts
    (held_figures) at every other refresh while the page's own run is young or just changed
    (`period` FRESH_REFRESH_S), every SECONDARY_HOLD_S for a watched job and a steady run;
    a change of settings, window or rank redraws every chart at once. An ended run
    (`period` None: drawn once, not refreshed) gets every chart as it is now, never one
    held from its last live refresh."""
    if period is None:
        state.pop("held", None)
        return figs
    hold = SECONDARY_HOLD_S if watching or period == STEADY_REFRESH_S else FRESH_HOLD_S
    return held_figures(state, key, figs, now, hold)


def rerun(state: dict[str, Any], *, fragment: bool, running: bool, watching: bool,
          live_every: float | None, young_without_verdict: bool, settings_moved: bool,
          step_learned: bool) -> str | None:
    """Whether the page reruns whole after its live region was drawn, and why (None: not):
    the rules of when the page redraws all of itself, in one place. `state` is the page's
    session state (the fragments' periods are set in it here). Each runs after every
    widget of the region was drawn: a widget a fragment run skips loses its state (the
    Auto-tune switch turned itself off when a rerun came before it)."""
    if fragment and not running:
        return "it ended: the still view takes over (an ended run is not re-read)"
    if fragment and running and not watching and live_every is not None and \
            live_every != state.setdefault("_live_every", FRESH_REFRESH_S):
        state["_live_every"] = live_every
        return "the live fragment takes its new period (live_period)"
    if fragment and running and watching:
        want = WATCH_FIRST_S if young_without_verdict else WATCH_REFRESH_S
        if want != state.setdefault("_watch_every", WATCH_FIRST_S):
            state["_watch_every"] = want
            return "the watched fragment takes its new period"
    if settings_moved:
        return "the settings moved elsewhere (Auto-tune, another tab): the sidebar follows"
    if step_learned:
        return "the calibrated step is known now: the sidebar shows the real one"
    return None
