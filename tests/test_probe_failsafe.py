"""The probe never harms the job it watches (NOTE [fail-safe probe] in
monitor/probe/patch.py): with any one of its entry points broken inside the user's process,
the script's output and exit status are the bare run's, no traceback reaches its stderr, and
the run says that timing stopped and why. A script that iterates no DataLoader is told so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.store import Store

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "probe_fault.py"
pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# each place the probe runs inside the user's process (tests/scripts/probe_fault.py)
# (the per-step path before and after next(inner) is one frame, TimedIterator.__next__: its
# guard before next() is met by "record" and "state", after it by "first_batch" and
# "batch_arrived"; under `monitor run` the steps and events leave through the relay's ring,
# "ring_put"; an event the ring refuses goes to the store: tests/test_relay.py)
POINTS = ["state", "recorder", "loop_role", "follow", "start_epoch", "note_workers", "record",
          "first_batch", "batch_arrived", "batch_done", "ring_put", "control",
          "flush_final"]


@pytest.fixture(scope="module")
def bare() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "any"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)


def monitored(db: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        "--", sys.executable, *args], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=180)
    return r, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("point", POINTS)
def test_a_broken_probe_leaves_the_script_as_it_runs_bare(point, bare, tmp_path, no_leaks):
    assert bare.returncode == 3 and bare.stdout.count("checksum 780") == 2, bare.stderr
    r, d = monitored(tmp_path / "f.db", str(SCRIPT), point)
    script_out = [ln for ln in r.stdout.splitlines() if not ln.startswith("{")]
    assert r.returncode == bare.returncode
    assert script_out == bare.stdout.splitlines()
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    stop = d.get("timing_stopped")
    assert stop is not None, (point, r.stderr[-2000:])
    assert "injected probe failure" in stop["text"] or "ProbeStateError" in stop["text"], stop
    assert "injected probe failure" in r.stderr or "ProbeStateError" in r.stderr
    assert "no torch DataLoader" not in d["verdict_text"]
    if d["steps"]:  # the steps before the fault are kept, and the verdict says it stopped
        assert "Timing stopped" in d["verdict_text"], d["verdict_text"]
    assert Store(tmp_path / "f.db").run(d["run_id"])["error"] == \
        "the script ended with exit code 3"


def test_a_script_without_a_dataloader_is_told_so(tmp_path, no_leaks):
    r, d = monitored(tmp_path / "n.db", str(ROOT / "tests" / "scripts" / "no_loader.py"))
    assert r.returncode == 0 and "epoch 1 done" in r.stdout, r.stderr
    assert d["steps"] == 0 and d["verdict_text"].startswith(
        "no torch DataLoader was iterated by this script"), d["verdict_text"]
    assert "from monitor import watch" in d["verdict_text"]
    assert "so far in this window" not in d["verdict_text"]  # no live-view sentence
    labels = Store(tmp_path / "n.db").events(d["run_id"], kinds=("probe",))["label"].tolist()
    assert labels == [d["verdict_text"]]
    assert "no torch DataLoader was iterated" in r.stderr


def test_the_probes_lines_start_on_a_line_of_their_own_under_a_progress_bar(tmp_path):
    """A live tqdm bar holds an unfinished `\\r` line on stderr (the HF Trainer's): the
    probe's first line comes after a newline, not in the middle of the bar."""
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / "t.db"),
                        "--", sys.executable, str(ROOT / "tests" / "scripts" / "tqdm_loop.py")],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "timing DataLoader" in r.stderr
    for i in [i for i in range(len(r.stderr)) if r.stderr.startswith("starvation-monitor:", i)]:
        assert i == 0 or r.stderr[i - 1] == "\n", repr(r.stderr[max(0, i - 60):i + 40])
