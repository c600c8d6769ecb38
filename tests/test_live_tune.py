"""The live autotune policy on synthetic measurement sequences, and a real attached run
tuned by itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.tuning.policy import LivePolicy, Observation

ROOT = Path(__file__).resolve().parent.parent
START = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False,
         "persistent_workers": False}


def obs(settings: dict, thr: float, se: float | None = 2.0, verdict: str = "starving",
        share: float = 0.5, advised: int | None = None, predicted: float | None = None,
        per_worker: float | None = None, left: float | None = None) -> Observation:
    return Observation(settings, thr, se, verdict, share, advised, predicted, per_worker, left)


def test_jumps_to_the_knee_keeps_what_pays_and_settles():
    p = LivePolicy(max_workers=4)
    m = p.observe(obs(START, 100.0, advised=2, predicted=250.0))
    assert m.settings["num_workers"] == 2 and m.settings["prefetch_factor"] == 2
    m = p.observe(obs(m.settings, 240.0, share=0.05, verdict="healthy"))
    assert p.moves[-1]["kept"] and p.best.throughput == 240.0
    assert m is None and p.settled and "100 → 240 samples/s (+140%)" in p.settled


def test_a_gain_within_the_noise_is_reverted():
    p = LivePolicy(max_workers=4)
    one = p.observe(obs(START, 100.0, se=10.0, advised=1, predicted=150.0))
    back = p.observe(obs(one.settings, 115.0, se=10.0))  # +15% but 2 x 14 = 28 of noise
    assert not p.moves[-1]["kept"] and back.settings == START
    assert "did not pay beyond the noise" in back.reason


def test_a_plateau_ends_the_search():
    p = LivePolicy(max_workers=8)
    m = p.observe(obs(START, 100.0, advised=3, predicted=300.0))
    m = p.observe(obs(m.settings, 290.0, share=0.2))  # still waiting: one more worker
    assert m.settings["num_workers"] == 4
    m = p.observe(obs(m.settings, 292.0, share=0.2))  # no gain: back to 3
    assert m.settings["num_workers"] == 3 and not p.moves[-1]["kept"]
    for _ in range(4):  # re-measured at 3; the other candidates do not pay either
        if m is None:
            break
        m = p.observe(obs(m.settings, 291.0, share=0.2))
    assert p.settled and p.best.settings["num_workers"] == 3


def test_a_move_past_the_memory_budget_is_never_made():
    p = LivePolicy(max_workers=8)
    m = p.observe(obs(START, 100.0, advised=6, predicted=500.0, per_worker=400.0, left=1000.0))
    assert m.settings["num_workers"] == 1  # not the knee: 6 x 400 MB > 1000 MB left
    m = p.observe(obs(m.settings, 180.0, advised=6, predicted=500.0, per_worker=400.0,
                      left=600.0))
    assert m.settings["num_workers"] == 2  # one more fits (400 <= 600); five more would not
    m = p.observe(obs(m.settings, 250.0, advised=6, predicted=500.0, per_worker=400.0,
                      left=300.0))
    assert m is None or m.settings["num_workers"] == 2  # a third worker would not fit


def test_a_healthy_job_is_left_alone():
    p = LivePolicy(max_workers=4)
    assert p.observe(obs(START, 300.0, verdict="healthy", share=0.02)) is None
    assert p.moves == [] and "no candidate" in p.settled


def test_a_failed_move_is_reverted_with_its_reason():
    p = LivePolicy(max_workers=4)
    m = p.observe(obs(START, 100.0, advised=2, predicted=250.0))
    back = p.observe(obs(m.settings, 0.0))  # workers killed: nothing came through
    assert back.settings == START and p.moves[-1]["throughput"] == 0.0


@pytest.mark.slow
def test_an_attached_script_tunes_its_own_loader(tmp_path, no_leaks):
    db = tmp_path / "t.db"
    """A loader waiting on storage (4 ms a sample) at num_workers=0: the autotuner measures
    the first epoch, jumps to the bound model's knee, and keeps it because it pays."""
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        "--autotune", "--", sys.executable,
                        str(ROOT / "tests" / "scripts" / "slow_loader.py"), "--epochs", "6"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    tune = d["autotune"]
    assert tune["start"]["num_workers"] == 0 and tune["moves"][0]["kept"]
    assert tune["final"]["num_workers"] >= 2 and tune["gain"] > 0.5
    assert "autotune" in r.stderr
    from monitor.store import Store

    events = Store(db).events(1)
    assert (events["kind"] == "autotune").any()
    assert events["label"].str.startswith("num_workers 0→").any()  # the move, as a marker
