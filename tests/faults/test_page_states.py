"""The page never shows a Python exception, whatever state a run record is in, and shows
text from users and the store as text (AppTest renders the whole page for each state)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from monitor.records import StepRecord

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = [pytest.mark.faults, pytest.mark.slow]
MARKDOWN_NAME = "[click](https://example.com/x) **bold** <b>html</b> :red[x]"
LOADER = {"num_workers": 0, "batch_size": 8, "prefetch_factor": None, "pin_memory": False,
          "persistent_workers": False}
MANAGED = {"preset": "healthy", **LOADER, "step_time_ms": 10.0, "model_size": "auto",
           "epoch_samples": None, "workload": None}
ATTACHED = {"preset": "custom", "workload": "attached:train.py"}


def steps(store, run: int, n: int = 40) -> None:
    now = time.time()
    store.insert([StepRecord(run, i, 0, now - 5 + i * 0.1, 0.06, 0.04, 8, 0)
                  for i in range(n)])


def make(store, state: str) -> int:
    """One run record in `state`; running ones carry a live PID (this process) so that the
    start-up's orphan check leaves them be."""
    kind = "attached" if state.startswith("attached") else "managed"
    cfg = {"empty-config": {}, "attached-before-first-epoch": ATTACHED,
           "attached-failed-no-steps": ATTACHED}.get(state, ATTACHED | LOADER
                                                      if kind == "attached" else MANAGED)
    run = store.create_run(MARKDOWN_NAME if state == "markdown-name" else state, kind, cfg)
    if "running" in state or state in ("attached-before-first-epoch", "stalled",
                                       "empty-config", "markdown-name"):
        store.update_run(run, pid=os.getpid())
    if state in ("running-with-steps", "stopped", "failed", "attached-finished", "stalled",
                 "markdown-name"):
        steps(store, run)
        store.update_run(run, accelerator_kind="simulated" if kind == "managed" else "cpu")
    if state == "stalled":
        store.add_event(run, "stalled", "no batch for 12 s: the loader looks stuck; the main "
                        "process is inside the dataset at data.py:7 (__getitem__)",
                        {"waiting_since": time.time() - 12})
    if state == "stopped":
        store.finish_run(run, "stopped", "stopped on request")
    if state == "failed":
        store.finish_run(run, "failed", "ValueError: corrupt record 7 in [shard](x.tar)")
    if state == "attached-failed-no-steps":
        store.finish_run(run, "failed", "the script ended with exit code 1")
    if state == "attached-finished":
        store.finish_run(run, "finished")
    return run


STATES = ["starting-running", "running-with-steps", "stopped", "failed",
          "attached-before-first-epoch", "attached-failed-no-steps", "attached-finished",
          "empty-config", "stalled", "markdown-name"]


@pytest.mark.parametrize("state", STATES)
def test_every_run_state_renders_without_an_exception(store, no_leaks, quiet_page, state):
    page = quiet_page
    run = make(store, state)
    page.run()
    assert page.selectbox(key="selected_run").value == run
    assert not page.exception, [e.value for e in page.exception]
    texts = " ".join(x.value for x in [*page.error, *page.info, *page.caption, *page.warning,
                                       *page.success])
    if state == "stalled":
        assert any("the loader looks stuck" in w.value for w in page.warning)
        assert "\\_\\_getitem\\_\\_" in texts  # underscores kept, not bold
    if state == "failed":
        assert "corrupt record 7 in \\[shard\\]\\(x\\.tar\\)" in texts
    if state == "markdown-name":
        from monitor.ui.text import plain

        assert plain(MARKDOWN_NAME) in texts  # every markdown character escaped
        assert "[click](https://example.com/x)" not in texts  # never a live link
    assert store.integrity_ok()
