"""`monitor run --live`: the run watched in the terminal, for a job on a machine reached over
SSH with no browser.

Every EVERY_S the same assessment as the page's KPI row (monitor/assess/window.py's recent
window) is read from the store and shown: throughput, data-wait share, verdict, the top
advice with its predicted gain, workers. On a terminal it is a rich Live table at the bottom
of the screen, with the script's own output relayed above it line by line (the script's
stdout and stderr are piped through rich's console, so neither overwrites the other; a
progress bar's redraws, lines ended by a lone carriage return, become the table's last row,
`script`); when
stderr is not a terminal, one plain line per EVERY_S and the script's output untouched.
"""
from __future__ import annotations

import contextlib
import io
import sys
import textwrap
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from monitor.config import LoaderConfig
from monitor.thresholds import VERDICT_MIN_STEPS

if TYPE_CHECKING:  # (the assessment's modules bring pandas: not on `monitor run`'s start)
    from monitor.assess.window import Assessment
    from monitor.diagnosis.finding import Advice

EVERY_S = 2.0
FIRST_EVERY_S = 0.25  # until the first verdict: it shows within a refresh of being known


def status(a: Assessment | None) -> dict[str, str]:
    """The figures one refresh shows, as text."""
    from monitor.diagnosis import NO_DATA  # (here: pandas is not on `monitor run`'s start)

    if a is None or a.verdict == NO_DATA:
        n = a.features.steps if a is not None else 0
        return {"verdict": f"judging after {VERDICT_MIN_STEPS} steps: {n} so far"}
    f, d = a.features, a.diagnosis
    top = d.advice[0] if d.advice else None
    return {"throughput": f"{f.throughput:,.0f} samples/s",
            "data-wait share": f"{f.data_wait_share:.0%}",
            "verdict": f"{d.named}: {d.headline}",
            "top advice": advice_text(top),
            "workers": str(f.config.get("num_workers", "–"))}


ADVICE_CHARS = 90  # the live table's advice cell: the summary at the end has it whole


def advice_text(top: Advice | None) -> str:
    """A loader setting as `name = value → predicted`; advice outside the loader (free the
    cores, change the dataset) as its sentence, shortened."""
    if top is None:
        return "none"
    gain = (f" → {top.predicted_throughput:,.0f} samples/s" if top.predicted_throughput
            else "")
    if top.param in LoaderConfig.__dataclass_fields__:
        return f"{top.param} = {top.value}{gain}"
    return textwrap.shorten(top.reason, ADVICE_CHARS, placeholder=" …") + gain


def line(run_id: int, s: dict[str, str]) -> str:
    """One plain status line (stderr not a terminal)."""
    return f"starvation-monitor: run {run_id}: " + " · ".join(
        f"{k} {v}" if k != "verdict" else v for k, v in s.items())


def table(run_id: int, s: dict[str, str]) -> Table:
    t = Table(title=f"starvation-monitor · run {run_id}", show_header=False,
              title_justify="left", expand=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for k, v in s.items():
        t.add_row(k, Text(v))  # text from the store stays text (no rich markup)
    return t


class LiveView:
    """The refreshing view of one run, an output of its live follow (monitor/assess/
    follow.py): each assessment it is handed redraws it (the table on a terminal, a plain
    line every EVERY_S elsewhere). `relay(stream, to)` copies the script's output above it.
    Started with the run, closed before the end-of-run summary."""

    name, takes_rows = "terminal", False  # it shows the assessed window

    def __init__(self, tty: bool, stream: IO[str] | None = None) -> None:
        self.run_id: int | None = None
        self.tty = tty
        self.stream = stream or sys.stderr
        self._live: Live | None = None
        self._relays: list[threading.Thread] = []
        self._lock = threading.Lock()  # the follow's thread and the relays both redraw
        self._closed = False
        self.shown: dict[str, str] = status(None)
        self.progress = ""  # the script's last progress-bar line (ended by a lone \r)
        self._printed = 0.0  # when the last plain line was printed
        if tty:
            self.console = Console(file=self.stream, force_terminal=True)

    def start(self, run_id: int) -> None:
        self.run_id = run_id
        if self.tty:
            self._live = Live(table(run_id, status(None)), console=self.console,
                              auto_refresh=False, redirect_stdout=False,
                              redirect_stderr=False)
            self._live.start()

    def on_rows(self, steps: Any, samples: Any) -> None:
        """(It shows the assessed window, not rows.)"""

    def verdict_every(self) -> float:
        return FIRST_EVERY_S if self._judging() else EVERY_S

    def on_verdict(self, a: Assessment | None) -> None:
        self.refresh(a)

    def relay(self, pipe: IO[bytes], to: IO[str]) -> None:
        """Copy the script's lines from `pipe` to the terminal above the live table."""
        def copy() -> None:
            # newline="": a line ends at \n, \r\n or a lone \r (a progress bar redrawing)
            text = io.TextIOWrapper(pipe, encoding="utf-8", errors="replace", newline="")
            for chunk in iter(text.readline, ""):
                if self._live is None or self._closed:
                    to.write(chunk)
                    to.flush()
                elif chunk.endswith("\r"):  # a redraw: the table's last row shows it
                    self.progress = chunk.strip()
                    self._draw()
                else:
                    with self._lock:  # one writer at a time: a redraw never cuts a line
                        self.console.print(Text(chunk.rstrip("\r\n")), soft_wrap=True,
                                           highlight=False)
        t = threading.Thread(target=copy, name="live-relay", daemon=True)
        t.start()
        self._relays.append(t)

    def _judging(self) -> bool:
        return str(self.shown.get("verdict", "")).startswith("judging")

    def refresh(self, a: Assessment | None) -> dict[str, str]:
        s = status(a)
        was, self.shown = self._judging(), s
        if self._live is not None:
            self._draw()
        elif not (was and self._judging()) or time.monotonic() - self._printed >= EVERY_S:
            self._printed = time.monotonic()  # a plain line: every EVERY_S, and the first
            print(line(self.run_id or 0, s), file=self.stream, flush=True)  # verdict at once
        return s

    def _draw(self) -> None:
        with self._lock:
            rows = {**self.shown, **({"script": self.progress} if self.progress else {})}
            if self._live is not None:
                self._live.update(table(self.run_id or 0, rows), refresh=True)

    def close(self) -> None:
        """After the script exited: the relays drain its last output, the view ends."""
        for t in self._relays:
            t.join(timeout=5.0)
        self._closed = True
        if self._live is not None:
            with contextlib.suppress(Exception):
                self._live.stop()
