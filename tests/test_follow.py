"""Following a live run (monitor/assess/follow.py): the follower hands each step once, a late
rank's too; every output of a run gets its new rows and its assessed window from one loop;
an output that fails is counted and never stops the others; the outputs `monitor run` can
give are each one entry with its flags (monitor/manage/outputs.py)."""
from __future__ import annotations

import time

import pandas as pd

from monitor.assess.follow import Follow, Follower
from monitor.assess.window import Context
from monitor.cli.args import build_parser
from monitor.manage import outputs
from monitor.records import StepRecord
from monitor.sampling.budget import cpu_budget
from monitor.store import ATTACHED, Store
from tests.conftest import wait_for


def steps(run: int, rank: int, first: int, n: int, t0: float) -> list[StepRecord]:
    return [StepRecord(run, i, 0, t0 + i * 0.05, 0.02, 0.03, 8, 0, rank=rank)
            for i in range(first, first + n)]


def test_the_follower_hands_each_step_once_a_late_ranks_too(tmp_path):
    store = Store(tmp_path / "f.db")
    run = store.create_run("job", ATTACHED, {})
    t0 = time.time()
    store.insert(steps(run, 0, 0, 10, t0))
    f = Follower(store, run)
    first = f.steps()
    assert sorted(first["step"]) == list(range(10)) and f.steps().empty
    # rank 1 flushes late: its steps are older than rank 0's newest, still handed over
    store.insert(steps(run, 1, 0, 5, t0) + steps(run, 0, 10, 3, t0))
    later = f.steps()
    assert sorted(zip(later["rank"], later["step"], strict=True)) == [
        *((0, i) for i in range(10, 13)), *((1, i) for i in range(5))]
    assert f.steps().empty


class Recorder:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail = name, fail
        self.rows: list[pd.DataFrame] = []
        self.verdicts: list = []
        self.calls: list[str] = []

    def start(self, run_id: int) -> None:
        self.calls.append(f"start {run_id}")

    def on_rows(self, steps: pd.DataFrame, samples: pd.DataFrame) -> None:
        if self.fail:
            raise RuntimeError("tracker down")
        if not steps.empty:
            self.rows.append(steps)

    def on_verdict(self, a) -> None:
        self.verdicts.append(a)

    def verdict_every(self) -> float:
        return 0.5

    def close(self) -> None:
        self.calls.append("close")


def test_every_output_is_fed_by_one_loop_and_a_failing_one_stops_nothing(tmp_path):
    store = Store(tmp_path / "f.db")
    run = store.create_run("job", ATTACHED, {"num_workers": 0, "batch_size": 8})
    good, bad = Recorder("good"), Recorder("bad", fail=True)
    follow = Follow(store, run, Context(cpu_budget(), 6), [bad, good],
                    every=0.05).start()
    try:
        t0 = time.time()
        store.insert(steps(run, 0, 0, 40, t0 - 2.0))
        assert wait_for(lambda: sum(len(r) for r in good.rows) >= 40, timeout=60)
        assert wait_for(lambda: any(a is not None and a.features.steps >= 3
                                    for a in good.verdicts), timeout=60)
        assert follow.errors["bad"] >= 1 and "tracker down" in follow.last_error["bad"]
        assert bad.verdicts  # its on_rows failing lost it nothing else
    finally:
        follow.stop()
    assert good.calls == [f"start {run}", "close"] and bad.calls[-1] == "close"
    assert not follow._loop.alive
    # each step handed once
    seen = pd.concat(good.rows)
    assert sorted(seen["step"]) == list(range(40))


def test_each_output_kind_has_its_flags_on_run_and_makes_nothing_unasked():
    parser = build_parser(6)
    run = parser.parse_args(["run", "--metrics-port", "9", "--no-live", "--", "x"])
    assert run.metrics_port == 9 and run.live is False
    bare = parser.parse_args(["run", "--no-live", "--", "x"])
    assert outputs.make(bare, rt=None) == []
    assert len(outputs.KINDS) >= 2
