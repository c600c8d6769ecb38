"""A run live in the notebook cell that trains: `watch(loader)` (and the Lightning, Hugging
Face and fastai callbacks) in a Jupyter kernel show the run's figures, its device-busy line,
its verdict and advice in the output of the cell whose loop is running, updated in place
about once a second; `monitor.show(run)` shows a run as it stands.

The kernel's side only: an HTML output with a display id, and a thread that puts each frame
of a feed process into it (monitor/manage/notebook.py, started with the kernel's own
interpreter, which follows the run in the store and renders). The assessment, pandas and
the rest stay in that process; the training thread only starts it, once a cell. It ends when
the cell finishes (IPython's post_run_cell: its stdin is closed, it writes a last frame).
Outside a Jupyter kernel none of this runs. STARVATION_MONITOR_NOTEBOOK=0 turns it off."""
from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import tempfile
import threading
from typing import Any

FEED = "monitor.manage.notebook"
OFF_ENV = "STARVATION_MONITOR_NOTEBOOK"

_view: CellView | None = None
_lock = threading.Lock()


def kernel_shell() -> Any:
    """The IPython shell of a Jupyter kernel this process is, else None (a plain script, a
    terminal IPython)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules or os.environ.get(OFF_ENV) == "0":
        return None
    shell = ipython.get_ipython()
    return shell if getattr(shell, "kernel", None) is not None else None


def _feed(db: str, run_id: int, once: bool, err: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", FEED, "--db", db, "--run", str(run_id),
                             *(["--once"] if once else [])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                            text=True)


class CellView:
    """One cell's live output of one run."""

    def __init__(self, shell: Any, db: str, run_id: int, once: bool = False) -> None:
        from IPython.display import HTML, display

        self.shell, self.HTML, self.run_id = shell, HTML, run_id
        self.cell = shell.execution_count
        self.handle = display(HTML(f"<div>starvation-monitor · run {run_id}: starting the "
                                   "live view…</div>"), display_id=True)
        self.frames = 0
        self.err = tempfile.TemporaryFile("w+")  # (a pipe left unread could fill and block)
        self.proc = _feed(db, run_id, once, self.err)
        self.thread = threading.Thread(target=self._pump, name="starvation-cell-view",
                                       daemon=True)
        self.thread.start()
        if not once:
            shell.events.register("post_run_cell", self._cell_done)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.handle.update(self.HTML(json.loads(line)))
                self.frames += 1
            except Exception:  # a frame that cannot be shown: the next one may
                pass
        code = self.proc.wait()
        self.err.seek(0)
        err = self.err.read()
        self.err.close()
        if self.frames == 0:  # the feed could not start: say why, as text
            last = (err.strip().splitlines() or ["no output"])[-1]
            self.handle.update(self.HTML(
                f"<div>starvation-monitor · run {self.run_id}: the live view could not start "
                f"(exit code {code}): {html.escape(last)}. The run is recorded; open it with "
                "<code>starvation-monitor dashboard</code>.</div>"))

    def _cell_done(self, *_: Any) -> None:
        try:
            self.shell.events.unregister("post_run_cell", self._cell_done)
        except ValueError:
            pass
        self.close()

    def close(self) -> None:
        """The feed writes its last frame and exits (its stdin closed)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass


def live(recorder: Any) -> None:
    """At an epoch's start (the probe's epoch hook): a live view in the running cell, unless
    it has one. Never raises into the loop."""
    global _view
    try:
        shell = kernel_shell()
        if shell is None or recorder.run_id is None:
            return
        with _lock:
            if _view is not None and _view.cell == shell.execution_count and \
                    _view.run_id == recorder.run_id:
                return
            if _view is not None:
                _view.close()
            _view = CellView(shell, str(recorder.store.path), int(recorder.run_id))
    except Exception as exc:  # the view is extra: the training goes on without it
        print(f"starvation-monitor: no live view in this cell: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def follow_in_cells(recorder: Any) -> None:
    """Register the live view as the recorder's epoch hook, once (in a kernel only)."""
    if kernel_shell() is not None and live not in recorder.epoch_hooks:
        recorder.epoch_hooks.append(live)


def show(run_id: int, db: str | os.PathLike[str] | None = None) -> None:
    """A run as it stands (its line over the whole run, its last window's verdict and
    advice) in this cell; outside a notebook, the same HTML's text is not printed: use
    `starvation-monitor report`."""
    from monitor.store import default_path

    shell = kernel_shell()
    if shell is None:
        raise RuntimeError("monitor.show() draws in a Jupyter notebook; elsewhere use "
                           f"`starvation-monitor report {run_id}`")
    view = CellView(shell, str(db or default_path()), int(run_id), once=True)
    view.thread.join(60)
    view.close()
