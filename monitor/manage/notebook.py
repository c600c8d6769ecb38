"""The live view of a run in a notebook cell: a process of the product's (the kernel's own
interpreter, `python -m monitor.manage.notebook --db PATH --run N`) that follows the run
(monitor/assess/follow.py) and writes the cell's HTML, one JSON string a line on stdout,
about once a second; the kernel's side (monitor/notebook.py) puts each into the cell
in place. The kernel itself imports nothing of this (pandas, the assessment): the probe
there stays torch and the standard library.

The view: the run's throughput, data-wait share and device busy (step-derived) now; a line
of the device busy and the data-wait share over the last POINTS windows of steps against the
training step (an inline SVG: no script, no CDN); the verdict and its advice. Every text from
the store is escaped (shown as text). It ends when its stdin closes (the cell finished: one
last frame first) or the run ends; `--once` writes one frame of the run as it stands (for
`monitor.show(run)`)."""
from __future__ import annotations

import argparse
import html
import json
import sys
import threading
from collections import deque
from typing import Any

import pandas as pd

from monitor.assess.follow import Follow, window_figures
from monitor.manage.context import machine_context
from monitor.store import RUNNING, Store

POINTS = 120  # windows of steps on the line (a quarter second each: the last half minute)
EVERY_S = 1.0
W, H = 360, 90  # the line's size in pixels


class CellFeed:
    """An Output of the run's follow: keeps the last POINTS windows and the last assessment,
    and writes the cell's HTML at each assessment."""

    name, takes_rows = "notebook", True

    def __init__(self, run: dict[str, Any], out: Any = None) -> None:
        self.run = run
        self.out = out if out is not None else sys.stdout
        self.points: deque[tuple[int, float, float]] = deque(maxlen=POINTS)
        self.assessment: Any = None
        self.frames = 0
        self._lock = threading.Lock()

    def start(self, run_id: int) -> None:
        pass

    def on_rows(self, steps: pd.DataFrame, samples: pd.DataFrame) -> None:
        if steps.empty:
            return
        f = window_figures(steps, pd.DataFrame())
        with self._lock:
            self.points.append((int(steps["step"].max()), f["device_busy"],
                                f["data_wait_share"]))

    def verdict_every(self) -> float:
        return EVERY_S

    def on_verdict(self, a: Any) -> None:
        self.assessment = a
        self.emit()

    def close(self) -> None:
        pass

    def emit(self, final: bool = False) -> None:
        with self._lock:
            text = render(self.run, list(self.points), self.assessment, final)
        self.out.write(json.dumps(text) + "\n")
        self.out.flush()
        self.frames += 1


def _line(points: list[tuple[int, float, float]]) -> str:
    """Device busy (solid) and data-wait share (dashed), 0-100%, against the step."""
    if len(points) < 2:
        return ""
    s0, s1 = points[0][0], max(points[-1][0], points[0][0] + 1)

    def xy(i: int) -> str:
        return " ".join(f"{(p[0] - s0) / (s1 - s0) * (W - 2) + 1:.1f},"
                        f"{(1 - p[i]) * (H - 2) + 1:.1f}" for p in points)
    return (f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
            'aria-label="device busy and data wait">'
            f'<rect x="0" y="0" width="{W}" height="{H}" fill="none" stroke="#ccc"/>'
            f'<polyline points="{xy(1)}" fill="none" stroke="#2a7" stroke-width="1.5"/>'
            f'<polyline points="{xy(2)}" fill="none" stroke="#d33" stroke-width="1" '
            'stroke-dasharray="3,2"/></svg>'
            f'<div style="font-size:11px;color:#666">steps {s0}-{points[-1][0]}: '
            '<span style="color:#2a7">device busy</span>, '
            '<span style="color:#d33">data wait</span> (share of step time)</div>')


def render(run: dict[str, Any], points: list[tuple[int, float, float]], a: Any,
           final: bool = False) -> str:
    """The cell's HTML: every text from the store escaped."""
    esc = html.escape
    name = esc(str(run.get("name") or "run"))
    head = f"starvation-monitor · run {int(run['id'])} · {name}"
    if a is None or a.features.steps == 0:
        body = "<div>waiting for the first steps…</div>"
    else:
        f, d = a.features, a.diagnosis
        kpis = (f"<b>{f.throughput:,.0f}</b> samples/s · data wait "
                f"<b>{f.data_wait_share:.0%}</b> · device busy <b>{1 - f.data_wait_share:.0%}"
                f"</b> · {f.steps} steps in the last {f.window_s:.0f} s")
        advice = "".join(f"<li>{esc(f'{x.param} = {x.value}')}: {esc(x.reason)}</li>"
                         for x in d.advice)
        body = (f"<div>{kpis}</div>{_line(points)}"
                f"<div><b>{esc(d.named)}</b>: {esc(d.headline)}</div>"
                + (f"<ul style='margin:2px 0'>{advice}</ul>" if advice else ""))
    state = " (ended)" if final else ""
    return (f'<div class="starvation-monitor" style="font-family:sans-serif;font-size:13px">'
            f"<div style='color:#555'>{head}{state}</div>{body}</div>")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monitor.manage.notebook")
    p.add_argument("--db", required=True)
    p.add_argument("--run", type=int, required=True)
    p.add_argument("--once", action="store_true")
    args = p.parse_args(argv)
    store = Store(args.db)
    run = store.run(args.run)
    if run is None:
        print(json.dumps(f"<div>starvation-monitor: no run {args.run} in {html.escape(args.db)}"
                         "</div>"), flush=True)
        return 1
    feed = CellFeed(run)
    follow = Follow(store, args.run, machine_context(), [feed])
    if args.once:  # the whole run: its steps in POINTS windows, its last window judged
        steps = store.steps(args.run)
        n = max(1, -(-len(steps) // POINTS))
        for i in range(0, len(steps), n):
            feed.on_rows(steps.iloc[i:i + n], pd.DataFrame())
        if len(steps):  # the window that ends at its last step
            feed.assessment = follow.assessment(float(steps["ts"].max()) + 0.01)
        feed.emit(final=run.get("status") != RUNNING)
        return 0
    ended = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the cell finished (or the kernel went)
        ended.set()

    threading.Thread(target=watch_stdin, name="starvation-cell-stdin", daemon=True).start()
    follow.start()
    while not ended.wait(EVERY_S):
        r = store.run(args.run)
        if r is None or r.get("status") != RUNNING:
            break
    follow.stop()
    follow.tick()
    feed.assessment = follow.assessment() or feed.assessment
    feed.emit(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
