"""The cause that held for most of a run: what its summary names.

A run's summary judges its steady window as one. A cause that the live view named window
after window can fall below its own threshold over the whole run (one slow sample in 128
holds the in-order queue in most 10 s windows, yet over a minute its held waits are a
smaller share of all waits), and the summary said "starving: more workers" where the live
view had said head-of-line for most of the run. So the summary looks at the run's windows
of the page's length (KPI_WINDOW_S) as the live view did, and keeps a cause that was named in
most of them, with how often it held.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from monitor.diagnosis import causes, limits
from monitor.frames import analysis
from monitor.thresholds import KPI_WINDOW_S

MAX_PARTS = 60  # windows looked at, at most (a long run: its last hour of steady state)


FAILURES = (limits.SHM, limits.OPEN_FILES, limits.OOM, limits.WORKER_KILLED,  # happened: outrank
            limits.LOADER_ERROR)


def keep_held(w: Any, a: Any) -> Any:
    """`a` (window.Assessment: the run's steady window judged as one), with the cause named
    in most of its KPI_WINDOW_S windows (of window.Window `w`) where `a` names none of its
    findings' causes, and no failure happened."""
    steps = w.steps
    if steps.empty or ("rank" in steps.columns and steps["rank"].nunique() > 1):
        return a
    start, end = analysis.span(steps)
    n = min(MAX_PARTS, int((end - start) // KPI_WINDOW_S))
    if n < 2:
        return a
    start = end - n * KPI_WINDOW_S
    report = w.loader_report or {"num_workers": int((w.run.get("config") or {})
                                                     .get("num_workers") or 0)}
    leads = []
    for i in range(n):
        lo, hi = start + i * KPI_WINDOW_S, start + (i + 1) * KPI_WINDOW_S
        part = steps[(steps["ts"] >= lo) & (steps["ts"] < hi)]
        host = w.host[(w.host["ts"] >= lo) & (w.host["ts"] < hi)] if not w.host.empty \
            else w.host
        if part.empty:
            continue
        lead = causes.lead(causes.find(part, host, report, [], analysis.throughput(part)))
        if lead is not None:
            leads.append(lead)
    counts = Counter(x.cause for x in leads)
    if not counts:
        return a
    cause, k = counts.most_common(1)[0]
    dg = a.diagnosis
    if k * 2 <= n or dg.cause in FAILURES or any(x.cause == cause for x in a.findings) or \
            counts.get(dg.cause or "", 0) >= k:
        return a
    found = next(x for x in reversed(leads) if x.cause == cause)
    found = dataclasses.replace(found, text=f"{found.text} (in {k} of the run's {n} "
                                f"{KPI_WINDOW_S:g} s windows)")
    workers = int(a.features.config.get("num_workers") or 0)
    dg = dataclasses.replace(dg, cause=cause,
                             headline=causes.headline(dg.headline, (found,), a.features),
                             advice=causes.merge(dg.advice, (found,), workers))
    return dataclasses.replace(a, diagnosis=dg, findings=(found, *a.findings))
