"""`monitor report RUN --html`: one self-contained HTML file of a run, to attach to a ticket.

The page's own figure functions (refresh.chart_figures over the whole run) drawn by plotly's
`to_html` with its JS inlined once (no network when opened), the verdict and the evidence it
came from (the steady state, as `run --json` reports it), the advice with its predicted gain,
the settings history and the autotuner's moves (the run's events), and the compare against
the run before it. Every text from users and the store is HTML-escaped. No streamlit.
"""
from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path
from typing import Any

from monitor import control
from monitor.assess.compare import CompareError, compare
from monitor.assess.window import assess, steady_window
from monitor.diagnosis import SIMULATED
from monitor.records import PROBE, STALL_KINDS
from monitor.store import Store
from monitor.ui import compare_text, refresh, view

EVENT_KINDS = (control.CONFIG, control.AUTOTUNE, *STALL_KINDS, PROBE)
CHART_ORDER = ("chart_util", "chart_thr", "chart_wait", "chart_host", "chart_phases")
STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}.verdict{font-size:1.2em;padding:.6em;background:#f4f4f8}
.muted{color:#666}"""


def _t(value: Any) -> str:
    """Text from the store, as text."""
    return html.escape("–" if value is None else str(value))


def _num(v: Any, spec: str = "{:,.1f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return spec.format(v) if isinstance(v, int | float) else _t(v)


def _table(rows: list[list[Any]], head: list[str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_t(h)}</th>" for h in head) + "</tr>")
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows]
    return "\n".join(out + ["</table>"])


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _charts(store: Store, run_id: int, simulated: bool) -> list[str]:
    v = view.load_view(store, run_id, None)
    if v is None or v.steps.empty:
        return ["<p class=muted>no steps recorded: no charts</p>"]
    figs = refresh.chart_figures(v, simulated)
    out = []
    for i, key in enumerate(k for k in CHART_ORDER if figs.get(k) is not None):
        fig = figs[key]
        out.append(fig.to_html(full_html=False, include_plotlyjs=i == 0,
                               config={"displaylogo": False}, div_id=key))
    return out


def _events(store: Store, run_id: int) -> str:
    ev = store.events(run_id, kinds=EVENT_KINDS)
    if ev.empty:
        return "<p class=muted>no settings changes or autotune moves</p>"
    t0 = float(store.run(run_id)["started_at"])
    rows = []
    for r in ev.itertuples(index=False):
        data = json.loads(r.data) if isinstance(r.data, str) else {}
        shown = {k: v for k, v in data.items() if k not in ("rank", "cadence")}
        rows.append([f"+{float(r.ts) - t0:.1f} s", _t(r.kind), _t(r.label),
                     _t(json.dumps(shown, sort_keys=True)) if shown else ""])
    return _table(rows, ["at", "kind", "what", "settings"])


def _compare(store: Store, run_id: int, ctx: Any) -> str:
    prev = store.previous_run(run_id)
    if prev is None:
        return "<p class=muted>no earlier run in this store to compare with</p>"
    try:
        out = compare(store, [str(prev), str(run_id)], ctx)
    except CompareError as exc:
        return f"<p class=muted>not compared with run {prev}: {_t(exc)}</p>"
    table = compare_text.kpi_table(out, [prev, run_id])
    rows = [[_t(label), *(_t(c) for c in row)] for label, row in zip(
        table.index, table.itertuples(index=False, name=None), strict=True)]
    diff = "; ".join(f"{k}: {' → '.join(map(str, v))}" for k, v in out["settings_diff"].items())
    return (_table(rows, ["", f"run {prev}", f"run {run_id}"])
            + f"<p>settings that differ: {_t(diff or 'none')}</p>"
            + f"<p>gate: {_t(out['gate']['text'])}</p>")


def render(store: Store, run_id: int, ctx: Any) -> str:
    """The report of one run as one HTML document."""
    run = store.run(run_id)
    if run is None:
        raise LookupError(f"no run {run_id} in {store.path}")
    w = steady_window(store, run_id)
    a = assess(w, ctx) if w is not None else None
    simulated = bool(w is not None and w.accelerator == SIMULATED)
    d = a.to_dict() if a is not None else {}
    kpis = [["throughput", _num(d.get("throughput")) + " samples/s"],
            ["data-wait share", _num(d.get("data_wait_share"), "{:.1%}")],
            ["device busy, mean", _num(d.get("device_busy_mean"), "{:.1%}")],
            ["steps in the steady state", _num(d.get("steps"), "{:,}")],
            ["window", _num(d.get("window_s")) + " s"],
            ["ranks", _num(d.get("world_size"), "{}")]]
    advice = [[_t(x["param"]), _t(x["value"]), _num(x["predicted_throughput"]), _t(x["reason"])]
              for x in d.get("advice", [])]
    evidence = [[_t(k), _t(v if not isinstance(v, float) else f"{v:.4g}")]
                for k, v in sorted(d.get("evidence", {}).items()) if v is not None]
    settings = [[_t(k), _t(v)] for k, v in sorted(run["config"].items()) if v is not None]
    ended = run.get("ended_at")
    span = (f"{_when(run['started_at'])} to {_when(ended)}"
            if isinstance(ended, float) and not math.isnan(ended) else
            f"from {_when(run['started_at'])}, still running when reported")
    body = [
        f"<h1>Run {run_id}: {_t(run['name'])}</h1>",
        f"<p>{_t(run['kind'])} · {_t(run['status'])} · {_t(span)} · accelerator "
        f"{_t(run.get('accelerator_kind') or run.get('accelerator'))}</p>",
        f"<p class=muted>error: {_t(run['error'])}</p>" if run.get("error") else "",
        f"<div class=verdict><b>{_t(d.get('verdict', 'no steps'))}</b>: "
        f"{_t(d.get('verdict_text', 'no steps were recorded'))}</div>",
        "<h2>Figures (steady state)</h2>", _table(kpis),
        "<h2>Advice</h2>",
        _table(advice, ["setting", "to", "predicted samples/s", "why"]) if advice
        else "<p class=muted>no advice</p>",
        "<h2>Charts (whole run)</h2>", *_charts(store, run_id, simulated),
        "<h2>Settings and moves</h2>", _events(store, run_id),
        "<h2>Starting settings</h2>", _table(settings),
        "<h2>Compared with the run before</h2>", _compare(store, run_id, ctx),
        "<h2>Evidence</h2>", _table(evidence),
        f"<p class=muted>Starvation Monitor report, written {_t(_when(time.time()))}</p>",
    ]
    return ("<!DOCTYPE html><html><head><meta charset=utf-8>"
            f"<title>Run {run_id}: {_t(run['name'])}</title><style>{STYLE}</style></head>"
            f"<body>{''.join(body)}</body></html>")


def write(store: Store, run_id: int, ctx: Any, path: Path) -> Path:
    """Write the report; returns its path."""
    text = render(store, run_id, ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
