"""The live autotuner's driver (monitor/tuning/live.py) against a real store: how a running
job's steps become stretches (epochs pooled, N steps past a start-up, windows), how the noise
of a stretch is estimated, and what it asks of the job (a move, a revert after a refusal,
nothing once the user has taken over)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from monitor.assess.window import Context, Window
from monitor.records import HostSample, StepRecord
from monitor.sampling.budget import cpu_budget
from monitor.thresholds import AUTOTUNE_MIN_STEPS as MIN_STEPS
from monitor.tuning.live import Cadence, LiveTuner, RankTuner, observation, std_error

START = {"preset": "custom", "num_workers": 0, "batch_size": 16, "prefetch_factor": None,
         "pin_memory": False, "persistent_workers": False}


def frame(epochs: list[int], seq: int = 0, t0: float = 0.0, wait: float = 0.05,
          compute: float = 0.01) -> pd.DataFrame:
    """Consecutive steps, one per entry of `epochs` (its epoch number)."""
    n = len(epochs)
    ts = t0 + np.arange(1, n + 1) * (wait + compute)
    return pd.DataFrame({"step": np.arange(n), "epoch": epochs, "ts": ts, "wait_s": wait,
                         "compute_s": compute, "samples": 16, "config_seq": seq, "rank": 0})


def test_short_epochs_are_pooled_and_an_epoch_is_judged_only_once_complete():
    t = RankTuner(0, 6, Cadence("epoch"))
    t.add(frame([0] * 8 + [1] * 8 + [2] * 3))  # epochs of 8 steps: 0 and 1 complete
    assert t.ready() is None  # 16 steps < MIN_STEPS: pooled with the next
    t.add(frame([2] * 5 + [3], t0=100))
    got = t.ready()
    assert got is not None and sorted(got["epoch"].unique()) == [0, 1, 2]
    assert len(got) >= MIN_STEPS and t.ready() is None  # the running epoch 3 waits


def test_an_epoch_stretch_ends_where_the_loop_asked_for_the_next_epoch():
    """What the job does between epochs (Lightning's validation) counts against the
    setting, as in the job's own epoch rate: the stretch ends at the probe's epoch-done
    mark, else at the next epoch's first batch asked for."""
    t = RankTuner(0, 6, Cadence("epoch"))
    steps = frame([0] * 30)  # 30 steps of 60 ms: 0.01 .. 1.81 s
    t.add(pd.concat([steps, frame([1], t0=2.7)]))  # then 0.9 s of validation
    got = t.ready()
    assert got is not None and t.end == pytest.approx(2.71)  # epoch 1's first wait start
    t.took()
    t.add(frame([1] * 29, t0=2.76))
    assert t.ready(done=1, done_at=5.2) is not None and t.end == 5.2  # the probe's mark
    steps = got.assign(config_seq=0)
    window = Window({"config": START, "status": "running"}, steps, pd.DataFrame())
    ctx = Context(budget=cpu_budget(), max_workers=4)
    with_gap = observation(window, ctx, {"num_workers": 0}, end=2.71)
    alone = observation(window, ctx, {"num_workers": 0})
    assert with_gap.throughput == pytest.approx(30 * 16 / 2.7)
    assert alone.throughput == pytest.approx(30 * 16 / 1.8)


def test_a_stretch_counts_only_steps_of_the_setting_asked_for():
    t = RankTuner(0, 6, Cadence("epoch"))
    t.add(frame([0] * 30 + [1]))
    assert t.ready() is not None
    t.took()
    t.wait_seq = 1  # a move was asked for: until it lands, nothing is judged
    t.add(frame([1] * 25 + [2], t0=10))
    assert t.ready() is None
    t.add(frame([3] * 25 + [4], seq=1, t0=20))
    got = t.ready()
    assert got is not None and set(got["config_seq"]) == {1} and set(got["epoch"]) == {3}
    assert not t.overridden


def test_persistent_workers_first_epoch_is_left_out_once():
    """Short epochs (Lightning's 12 batches) under a setting that keeps its workers: the
    first epoch holds their start, paid once, so it is not judged; the ones after are."""
    t = RankTuner(0, 6, Cadence("epoch"))
    t.wait_seq = 1  # a move to persistent workers was asked for, and lands at epoch 2
    t.add(frame([2] * 12 + [3] * 12 + [4], seq=1))
    assert t.ready(in_flight=4, persistent=True) is None  # epoch 2 out, 12 < MIN_STEPS
    t.add(frame([4] * 11 + [5], seq=1, t0=20))
    got = t.ready(in_flight=4, persistent=True)
    assert got is not None and sorted(got["epoch"].unique()) == [3, 4]
    t.took()
    t.add(frame([5] * 11 + [6] * 12 + [7], seq=1, t0=40))  # same setting: nothing more out
    assert sorted(t.ready(in_flight=4, persistent=True)["epoch"].unique()) == [5, 6]


def test_steps_cadence_skips_each_settings_start_up():
    t = RankTuner(0, 6, Cadence("steps", steps=40))
    t.add(frame([0] * 44))
    assert t.ready(in_flight=8) is None  # 44 < 8 skipped + 40
    t.add(frame([0] * 4, t0=50))
    got = t.ready(in_flight=8)
    assert got is not None and len(got) == 40 and int(got["step"].iloc[0]) == 8


def test_window_cadence_waits_for_its_seconds_after_warm_up():
    t = RankTuner(0, 6, Cadence("window", seconds=4.0))
    t.add(frame([0] * 60))  # 3.6 s
    assert t.ready() is None
    t.add(frame([0] * 60, t0=3.6))
    got = t.ready()
    assert got is not None and float(got["ts"].max() - got["ts"].min()) >= 4.0
    assert float(got["ts"].min()) >= 1.0  # its warm-up left out


def test_a_change_nobody_asked_for_is_noticed():
    t = RankTuner(0, 6, Cadence("epoch"))
    t.add(frame([0] * 30 + [1]))
    t.add(frame([2] * 5, seq=1, t0=10))
    assert t.unexpected and set(t.buf["config_seq"]) == {1}


def test_the_noise_is_measured_over_parts_longer_than_a_prefetch_cycle():
    # 4 workers x prefetch 2: batches come in bursts of 8 (7 ready, then a long wait)
    waits = [0.0] * 7 + [0.4]
    bursty = frame([0] * 80)
    bursty["wait_s"] = np.tile(waits, 10)
    se = std_error(bursty, in_flight=8)
    rate = 16 * 80 / float(bursty["wait_s"].sum() + bursty["compute_s"].sum())
    assert se is not None and se < 0.01 * rate  # whole cycles per part: steady, not bursty
    assert std_error(bursty.iloc[:20], in_flight=8) is None  # not two cycles per part


def attached_run(store, epochs: int, seq: int = 0, t0: float = 1.7e9, wait: float = 0.05,
                 settings: dict | None = None, step0: int = 0) -> float:
    """Steps (and host samples) of an attached script at num_workers=0, loading on the
    main process: `epochs` epochs of 25 steps from t0; returns the time after the last."""
    cfg = settings or START
    store.set_rank(1, 0, None, 1, "vm", 4242, cfg, "cpu")
    steps, t, i = [], t0, step0
    for e in range(epochs + 1):  # + the running epoch's first step
        for _ in range(25 if e < epochs else 1):
            t += wait
            steps.append(StepRecord(1, i, e + step0 // 25, t, wait, 0.01, 16, seq))
            t += 0.01
            i += 1
    store.insert(steps)
    store.insert([HostSample(ts=t0 + k * 0.25, run_id=1, cpu_total_pct=50.0,
                             cpu_per_core=json.dumps([90.0, 10.0]), mem_used_mb=4000.0,
                             mem_total_mb=24000.0, mem_available_mb=20000.0,
                             shm_used_mb=1.0, proc_cpu_pct=20.0, proc_rss_mb=300.0, workers=0,
                             workers_cpu_pct=0.0, workers_rss_mb=0.0, workers_uss_mb=0.0,
                             proc_runq_pct=0.0, workers_runq_pct=0.0, proc_read_kb_s=0.0,
                             workers_read_kb_s=0.0)
                  for k in range(int((t - t0) / 0.25))])
    return t


def tuner_for(store) -> LiveTuner:
    run = store.create_run("train.py", "attached", {**START, "workload": "attached:train.py"})
    assert run == 1
    return LiveTuner(store, 1, Context(cpu_budget(), 6), cadence=Cadence("epoch"))


def test_a_starving_attached_job_is_asked_for_a_worker_and_the_move_is_recorded(store):
    tuner = tuner_for(store)
    attached_run(store, epochs=1)
    assert tuner.step() is True
    reqs = store.control_requests(1)
    assert len(reqs) == 1
    payload = json.loads(reqs["payload"].iloc[0])
    assert payload["num_workers"] > 0 and payload["source"].startswith("autotune: ")
    ev = store.events(1)
    assert (ev["kind"] == "autotune").any()
    assert tuner.step() is True and len(store.control_requests(1)) == 1  # waits for it


def test_a_refused_move_is_a_failed_move_and_the_search_goes_on(store):
    tuner = tuner_for(store)
    t = attached_run(store, epochs=1)
    tuner.step()
    cid = int(store.control_requests(1)["id"].iloc[0])
    store.mark_control(cid, "refused: the script's loader cannot take it")
    attached_run(store, epochs=1, t0=t, step0=26)  # still at num_workers=0
    tuner.step()
    moves = tuner.summary()["moves"]
    assert moves and moves[0]["failed"].startswith("refused") and not moves[0]["kept"]
    labels = store.events(1, kinds=("autotune",))["label"].tolist()
    assert any("failed: refused" in x for x in labels), labels  # its effect, recorded
    assert not any("by hand" in x for x in labels), labels  # it never left num_workers=0
    reqs = store.control_requests(1)  # newest first: the search went on to another move
    assert len(reqs) == 2 and reqs["payload"].iloc[0] != reqs["payload"].iloc[1]


def test_a_change_by_hand_turns_auto_tune_off(store):
    tuner = tuner_for(store)
    t = attached_run(store, epochs=1)
    tuner.step()
    asked = json.loads(store.control_requests(1)["payload"].iloc[0])["num_workers"]
    # the request is out, but the user applied another setting from the page first
    attached_run(store, epochs=1, seq=1, t0=t, step0=50,
                 settings={**START, "num_workers": asked + 1, "prefetch_factor": 2})
    assert tuner.step() is False
    assert "by hand" in tuner.summary()["error"]


def test_the_end_of_run_lines_give_each_ranks_moves():
    from monitor.manage.attached_summary import summary_lines

    move = {"settings": {"num_workers": 2, "prefetch_factor": 2}, "reason": "the knee",
            "throughput": 300.0, "best_before": 100.0, "kept": True, "failed": None}
    tune = {"moves": [move], "settled": "settled at num_workers=2", "ranks": {
        0: {"moves": [move], "settled": "settled at num_workers=2"},
        1: {"moves": [{**move, "kept": False, "failed": "refused: no"}], "settled": None}}}
    d = {"run_id": 1, "status": "finished", "steps": 100, "throughput": 600.0,
         "data_wait_share": 0.1,
         "verdict": "healthy", "verdict_text": "fed", "ranks": [], "autotune": tune}
    text = "\n".join(summary_lines(d))
    assert "autotune rank 0 move 1: num_workers=2, prefetch_factor=2 (the knee) → 300" in text
    assert "autotune rank 1 move 1:" in text and "failed: refused: no" in text
    assert "autotune rank 1: still searching when the job ended" in text


def test_a_change_that_leaves_the_loader_alone_is_no_takeover(store):
    """A managed workload's calibrated step time is a new config generation too: the search
    goes on, the old generation's steps dropped."""
    tuner = tuner_for(store)
    t = attached_run(store, epochs=1)
    tuner.step()
    tuner.ranks[0].wait_seq, tuner.ranks[0].expect = None, None  # as if the move were judged
    tuner.ranks[0].policy.pending = None
    attached_run(store, epochs=1, seq=1, t0=t, step0=50)  # seq 1, the same loader settings
    assert tuner.step() is True and not tuner.errors
