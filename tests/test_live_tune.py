"""The one tuning policy on synthetic measurement sequences, and real attached scripts
tuned live: against a grid of fresh runs, mid-epoch, and a healthy script left alone."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.thresholds import MIN_STEP_GAIN, OTHER_LOAD_CORES, noise_band, std_error
from monitor.tuning.policy import Observation, Policy

ROOT = Path(__file__).resolve().parent.parent
START = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False,
         "persistent_workers": False}


def obs(settings: dict, thr: float, se: float | None = 2.0, verdict: str = "starving",
        share: float = 0.5, advised: int | None = None, predicted: float | None = None,
        per_worker: float | None = None, left: float | None = None,
        advice: tuple = ()) -> Observation:
    return Observation(settings, thr, se, verdict, share, advised, predicted, per_worker, left,
                       advice=advice)


def test_jumps_to_the_knee_keeps_what_pays_and_settles():
    p = Policy(max_workers=4)
    m = p.observe(obs(START, 100.0, advised=2, predicted=250.0))
    assert m.settings["num_workers"] == 2 and m.settings["prefetch_factor"] == 2
    assert m.predicted == 250.0  # kept through the move's persistent workers from 0
    m = p.observe(obs(m.settings, 240.0, share=0.02, verdict="healthy"))  # 2% left: < 3%
    assert p.moves[-1]["kept"] and p.best.throughput == 240.0
    assert m is None and p.settled and "100 → 240 samples/s (+140%)" in p.settled


def test_workers_kept_between_epochs_that_do_not_pay_are_tried_restarted():
    """From none the knee keeps its workers between epochs; measured not to pay (Lightning
    with validation on 96-batch epochs: 2 kept workers 950-1,270 samples/s, 2 restarted
    1,250-1,500), the same workers restarted each epoch are tried next."""
    p = Policy(max_workers=4)
    kept = p.observe(obs(START, 100.0, advised=2, predicted=200.0))
    assert kept.settings["persistent_workers"] is True
    back = p.observe(obs(kept.settings, 95.0))
    assert back.revert and back.settings == START
    plain = p.observe(obs(START, 100.0, advised=2, predicted=200.0))
    assert plain.settings["num_workers"] == 2 and not plain.settings["persistent_workers"]
    assert "restarted each epoch" in plain.reason and plain.predicted == 200.0
    p.observe(obs(plain.settings, 150.0))
    assert p.moves[-1]["kept"] and p.best.settings == plain.settings


def test_a_gain_within_the_noise_is_reverted():
    p = Policy(max_workers=4)
    one = p.observe(obs(START, 100.0, se=10.0, advised=1, predicted=150.0))
    again = p.observe(obs(one.settings, 115.0, se=10.0))  # +15% but 2 x 14 = 28 of noise
    assert again.extend and again.settings == one.settings and not p.moves  # once more
    back = p.observe(obs(one.settings, 101.0, se=10.0))  # pooled: 108 ± 8.5: not beyond
    assert not p.moves[-1]["kept"] and back.settings == START and back.revert
    assert "did not pay beyond the noise" in back.reason
    assert p.moves[-1]["throughput"] == pytest.approx(108.0)


def test_a_promising_gain_confirmed_by_a_second_measurement_is_kept():
    p = Policy(max_workers=4)
    one = p.observe(obs(START, 100.0, se=10.0, advised=2, predicted=200.0))
    assert p.observe(obs(one.settings, 120.0, se=10.0)).extend
    p.observe(obs(one.settings, 128.0, se=3.0))  # pooled 124 ± 5.2: +24 > 2 x 11.3 = 22.5
    assert p.moves[-1]["kept"] and p.best.throughput == pytest.approx(124.0)


def test_a_lucky_first_reading_does_not_stand_against_every_move():
    """The start read 430 (a fast moment of a shared host), the move 400, so it went back;
    measured again the start reads 280: the move, which beats that beyond the noise, is
    gone back to and kept. A re-reading within the noise is pooled with the first."""
    p = Policy(max_workers=4)
    m = p.observe(obs(START, 430.0, se=10.0, advised=2, predicted=600.0))
    back = p.observe(obs(m.settings, 400.0, se=10.0))
    assert back.revert and back.settings == START and not p.moves[-1]["kept"]
    again = p.observe(obs(START, 280.0, se=10.0))
    assert again.revert and again.settings == m.settings and p.moves[-1]["kept"]
    assert p.best.throughput == 400.0 and p.start.throughput == 280.0
    q = Policy(max_workers=4)
    m = q.observe(obs(START, 300.0, se=10.0, advised=2, predicted=600.0))
    q.observe(obs(m.settings, 250.0, se=10.0))  # worse: back
    nxt = q.observe(obs(START, 310.0, se=10.0))  # within the noise of 300: pooled
    assert q.best.throughput == pytest.approx(305.0) and not nxt.revert
    assert not any(mv["kept"] for mv in q.moves)


def test_a_plateau_ends_the_search():
    p = Policy(max_workers=8)
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
    p = Policy(max_workers=8)
    m = p.observe(obs(START, 100.0, advised=6, predicted=500.0, per_worker=400.0, left=1000.0))
    assert m.settings["num_workers"] == 1  # not the knee: 6 x 400 MB > 1000 MB left
    m = p.observe(obs(m.settings, 180.0, advised=6, predicted=500.0, per_worker=400.0,
                      left=600.0))
    assert m.settings["num_workers"] == 2  # one more fits (400 <= 600); five more would not
    deeper = (("prefetch_factor", 4, 300.0, "prefetch_factor 2 → 4: a deeper queue rides "
               "out a slow batch"),)  # the diagnosis's advice (rules.py tail_stalls)
    m = p.observe(obs(m.settings, 250.0, advised=6, predicted=500.0, per_worker=400.0,
                      left=300.0, advice=deeper))
    # a third worker would not fit: the next candidate is the diagnosis's other advice, a
    # deeper prefetch on 2 workers (persistent since the first move from 0 workers)
    assert m.settings == {**START, "num_workers": 2, "prefetch_factor": 4,
                          "persistent_workers": True}
    assert m.reason == "the diagnosis: prefetch_factor 2 → 4: a deeper queue rides out a " \
        "slow batch"


def test_a_healthy_job_is_left_alone():
    p = Policy(max_workers=4)
    assert p.observe(obs(START, 300.0, verdict="healthy", share=0.06)) is None
    assert p.moves == [] and "keeps the device fed" in p.settled


def test_a_failed_move_is_reverted_with_its_reason():
    p = Policy(max_workers=4)
    m = p.observe(obs(START, 100.0, advised=2, predicted=250.0))
    back = p.observe(obs(m.settings, 0.0))  # workers killed: nothing came through
    assert back.settings == START and p.moves[-1]["throughput"] == 0.0


def test_from_no_workers_without_a_prediction_it_starts_with_a_loader_per_core():
    """One worker alone only overlaps loading with a 5% compute: no climb through it."""
    p = Policy(max_workers=6)
    m = p.observe(Observation(START, 300.0, 3.0, "cpu-bound", 0.95, cores=2))
    assert m.settings["num_workers"] == 2 and "per usable core" in m.reason
    m = p.observe(Observation(m.settings, 420.0, 3.0, "cpu-bound", 0.9, cores=2))
    assert m.settings["num_workers"] == 3  # the model says cores-bound; the gain says climb
    m = p.observe(Observation(m.settings, 425.0, 3.0, "cpu-bound", 0.9, cores=2))
    assert m.revert and m.settings["num_workers"] == 2
    assert p.observe(Observation(m.settings, 421.0, 3.0, "cpu-bound", 0.9, cores=2)) is None
    # cores-bound, the last move did not pay; 2 workers' two readings pooled
    assert p.best.throughput == pytest.approx(420.5) and p.settled


def monitor_run(db: Path, script: str, *args: str, tune: tuple = ("--autotune",),
                ) -> tuple[subprocess.CompletedProcess, dict]:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        *tune, "--", sys.executable, str(ROOT / "tests" / "scripts" / script),
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def bare_rates(nw: int, epochs: int = 3) -> list[float]:
    """The script run bare (no monitor) at a fixed num_workers: its own per-epoch samples/s,
    the first epoch left out (its workers' start-up)."""
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "cpu_loader.py"),
                        "--epochs", str(epochs), "--num-workers", str(nw), *CPU_ARGS],
                       capture_output=True, text=True, timeout=120, check=True)
    return [float(m) for m in re.findall(r"([\d.]+) samples/s", r.stdout)][1:]


CPU_ARGS = ("--work", "30")


def data_of(events) -> list[dict]:
    return [json.loads(x) for x in events["data"] if isinstance(x, str)]


@pytest.mark.slow
def test_live_autotune_reaches_the_best_fixed_setting_of_a_grid(tmp_path, no_leaks):
    """A script with CPU-heavy loading at num_workers=0 is tuned live, and its final
    setting, within 5 epochs, runs within 5% of the best of a grid of fresh bare runs
    (measured head to head), or within the noise of those measurements (epochs of a second
    on a shared host differ by 10-20% run to run: a difference below that is not one the
    tuner can see either). On a machine where other processes take cores the autotuner does
    not compete for them (the bound model's cores are the ones left), so there it must only
    end on a setting it measured no slower than where it began (the grid, run after the
    tuned run, is left out there)."""
    r, d = monitor_run(tmp_path / "t.db", "cpu_loader.py", "--epochs", "6", *CPU_ARGS)
    tune = d["autotune"]
    final = tune["final"]["num_workers"]
    assert tune["start"]["num_workers"] == 0 and tune["moves"], r.stderr
    # the first move's prediction beside what it measured, and the machine's scale learnt
    # from it (bound.py: later predictions on this store are multiplied by it)
    from monitor.assess import outcomes
    from monitor.store import Store

    done = [o for o in d["outcomes"] if o["measured"] is not None]
    assert d["prediction_scales"] == outcomes.scale_of(Store(tmp_path / "t.db"))
    if len(done) == 1 and done[0]["limit"]:
        off = done[0]["measured"] / done[0]["predicted"]
        assert d["prediction_scales"] == {
            done[0]["limit"]: pytest.approx(min(1.5, max(0.5, off)), abs=1e-4)}
    events = Store(tmp_path / "t.db").events(1)
    applied = [e["applied_at_epoch"] for e in data_of(events)
               if e.get("num_workers") == final
               and e.get("applied_at_epoch") is not None]
    if final == 0:  # it went back to where it began: every move it tried was measured worse
        assert all(not m["kept"] for m in tune["moves"]), tune["moves"]
    else:
        assert applied and min(applied) <= 4  # in use from the 5th epoch on
    moves = [(m["settings"]["num_workers"], round(m["throughput"]), round(m["best_before"]),
              m["kept"], m["other_cores"], m["other_cores_before"]) for m in tune["moves"]]
    # other processes' cores while it tuned (each move's and the best's it was judged
    # against), not only the run's last window: the suite's other tests ran 1.1-1.4 cores
    # beside its one move and were gone by its end (0.00), and the grid then ran on a quiet
    # box the tuner never saw
    others = max([d["evidence"]["other_cpu_cores"] or 0.0, *(
        c or 0.0 for m in tune["moves"] for c in (m["other_cores"], m["other_cores_before"]))])
    if others >= OTHER_LOAD_CORES:  # the grid would not say what the tuner could see
        if final != 0:  # a move it kept was measured better than where it began
            assert tune["final_throughput"] >= tune["start_throughput"], (others, moves)
        # else back where it began (every move measured worse, asserted above): its start
        # and end are two readings of one setting minutes apart on a host whose other load
        # changes; they differ by the host, not by the tuner
        return
    # on a quiet host, the grid after the tuned run, then one more run of the final and the
    # best, interleaved (final, then best: the grid ran best last or before final), head to
    # head
    grid = {nw: bare_rates(nw) for nw in (0, 2, 3)}  # a loader per core and one more
    best = max(grid, key=lambda nw: statistics.mean(grid[nw]))
    pairs = {nw: list(grid[nw]) if nw in grid else bare_rates(nw) for nw in {best, final}}
    for nw in (final, best) if final != best else ():
        pairs[nw] += bare_rates(nw)
    f, b = (statistics.mean(pairs[nw]) for nw in (final, best))
    noise = noise_band([std_error(pairs[final]), std_error(pairs[best])])
    note = (f"grid {grid}, final {final}, head to head {pairs}: {f:.0f} vs {b:.0f} ± "
            f"{noise:.0f}, other load {others:.2f} cores, moves (workers, rate, best before, "
            f"kept, other cores, before) {moves}")
    # or the tuner measured the grid's best itself, head to head with its own best then, and
    # saw no gain beyond its noise (the grid, minutes later, read the box in another minute:
    # 2 workers measured 615-741 there)
    tried = [m for m in tune["moves"] if m["settings"]["num_workers"] == best
             and not m["kept"] and not m["failed"]
             and m["throughput"] <= m["best_before"] * (1 + max(MIN_STEP_GAIN, m["noise"] or 0))]
    assert f >= 0.95 * b - noise or tried, note


@pytest.mark.slow
def test_mid_epoch_moves_keep_every_sample_once(tmp_path, no_leaks):
    """Two epochs of a shuffled map-style dataset: with --autotune-every-steps the moves
    land at step boundaries inside an epoch, and each epoch still yields every sample
    exactly once, in an order of its own. 250 steps: the first move (0 to 6 workers) needs
    its start-up (12 batches in flight) and 30 steps after it lands, maybe twice (an
    extension within the noise). The tuner's moves make the workers persistent (the second
    epoch resets the iterator a move built) and may try in_order=False (its batches cannot
    be resumed at a position: a move then waits for the epoch's end); both once lost
    samples."""
    r, d = monitor_run(tmp_path / "m.db", "slow_loader.py", "--epochs", "2", "--samples",
                       "2000", "--shuffle", tune=("--autotune", "--autotune-every-steps",
                                                  "30"))
    for e in (0, 1):
        assert f"epoch {e}: every sample once: True" in r.stdout, (r.stdout, r.stderr)
    orders = re.findall(r"epoch \d: order (\d+)", r.stdout)
    assert len(orders) == 2 and orders[0] != orders[1], r.stdout  # shuffled each epoch
    assert d["autotune"]["moves"] and d["autotune"]["moves"][0]["kept"], r.stderr
    from monitor.store import Store

    ev = Store(tmp_path / "m.db").events(1)
    steps = [e.get("applied_at_step") for e in data_of(ev)]
    assert any(s for s in steps), "no change applied mid-epoch"
    assert ev["label"].str.startswith("autotune: num_workers 0→").any()  # the marker


@pytest.mark.slow
def test_a_healthy_script_is_left_alone(tmp_path, no_leaks):
    """Cheap samples and a long device step: the loader keeps up at num_workers=0, so the
    autotuner says so and asks for nothing."""
    r, d = monitor_run(tmp_path / "h.db", "cpu_loader.py", "--epochs", "3", "--work", "0",
                       "--samples", "320", "--step-ms", "25")
    tune = d["autotune"]
    assert tune["moves"] == [] and "keeps the device fed" in (tune["settled"] or ""), r.stderr
    from monitor.store import Store

    assert Store(tmp_path / "h.db").control_requests(1).empty


def test_mid_epoch_needs_a_position_to_resume_from():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    from monitor.probe.epoch_plan import why_not_resumable

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    assert "IterableDataset" in why_not_resumable(DataLoader(Stream(), batch_size=2))
    assert "batch sampler" in why_not_resumable(DataLoader(list(range(10)), batch_size=None))
    assert why_not_resumable(DataLoader(torch.arange(10), batch_size=2, shuffle=True)) is None


def test_pinned_memory_is_tried_only_on_cuda_when_the_copy_shows():
    """The tuner's moves past num_workers are the diagnosis's advice, not decided again:
    pin_memory where the diagnosis saw the copy (CUDA's copy share: rules.py
    transfer_bound), nothing where it gave no such advice (no device copy on a CPU)."""
    two = {**START, "num_workers": 2, "prefetch_factor": 2}
    pin = (("pin_memory", True, None, "page-locked batches copy by DMA and overlap compute "
            "with non_blocking=True"),)
    fed = Observation(two, 500.0, 3.0, "transfer-bound", 0.01, cuda=True, cores=2, advice=pin)
    m = Policy(max_workers=6).observe(fed)
    assert m.settings["pin_memory"] is True and "copy by DMA" in m.reason
    cpu = Observation(two, 500.0, 3.0, "transfer-bound", 0.01, cuda=False, cores=2)
    assert Policy(max_workers=6).observe(cpu) is None  # no device copy to speed up
    # a memory relief (prefetch 1, pin_memory off) trades speed for room: never searched
    relief = (("prefetch_factor", 1, None, "fewer batches in flight"),
              ("pin_memory", False, None, "pinned pages cannot be swapped"))
    tight = Observation({**two, "pin_memory": True}, 500.0, 3.0, "memory-pressure", 0.3,
                        cores=2, advice=relief)
    m = Policy(max_workers=6).observe(tight)
    assert m is None or (m.settings["prefetch_factor"] != 1 and m.settings["pin_memory"])


def test_the_tuner_tries_what_the_diagnosis_advises_from_a_run_it_assessed(store):
    """One advice engine: the observation of a stored head-of-line run carries the
    diagnosis's in_order advice, and the policy's next move is that advice."""
    from monitor.tuning.policy import loader_advice

    advice = [{"param": "in_order", "value": False, "predicted_throughput": 655.0,
               "reason": "in_order=False lets finished batches pass a slow one"},
              {"param": "dataset", "value": "bounded cache", "predicted_throughput": None,
               "reason": "not a loader setting"}]
    items = loader_advice(advice)
    assert items == (("in_order", False, 655.0,
                      "in_order=False lets finished batches pass a slow one"),)
    four = {**START, "num_workers": 4, "prefetch_factor": 2}
    m = Policy(max_workers=6).observe(Observation(four, 520.0, 3.0, "starving", 0.3, cores=2,
                                                  advice=items))
    assert m.settings["in_order"] is False and m.reason.startswith("the diagnosis: in_order")


def test_a_move_measured_under_another_host_load_is_judged_head_to_head():
    """0 workers measured on a quiet host (300/s); 2 workers measured while another process
    took 1.1 cores (-32%, 204/s). Not judged on that: the best is measured again under the
    same load (150/s), and then 2 workers win and are gone back to."""
    p = Policy(max_workers=4)
    quiet = dataclasses.replace(obs(START, 300.0, share=0.6, advised=2, predicted=500.0),
                                other_cores=0.1)
    m = p.observe(quiet)
    assert m.settings["num_workers"] == 2
    busy_move = dataclasses.replace(obs(m.settings, 204.0, share=0.3), other_cores=1.1)
    back = p.observe(busy_move)
    assert back.revert and back.remeasure and back.settings == START
    assert "1.1 vs 0.1 cores" in back.reason and p.moves == []  # not judged yet
    again = p.observe(dataclasses.replace(obs(START, 150.0, share=0.7), other_cores=1.2))
    assert p.moves[-1]["kept"] and p.best.settings["num_workers"] == 2
    assert again.settings["num_workers"] == 2 and again.revert
    assert p.moves[-1]["other_cores"] == 1.1 and p.moves[-1]["other_cores_before"] == 1.2
    from monitor.tuning.policy import host_note, outcome

    assert outcome(p.moves[-1]) == "kept"
    assert host_note(p.moves[-1]) == "; host: other processes 1.1 vs 1.2 cores"
    # its gain is counted from where it began measured under the same load, not the quiet
    # reading (which said 300 -> 204, a loss, of a move that won head to head)
    s = p.summary()
    assert s["start_throughput"] == 150.0 and s["final_throughput"] == 204.0
    assert s["gain"] == pytest.approx(204 / 150 - 1)


def test_reverted_moves_say_what_was_measured():
    from monitor.tuning.policy import outcome

    worse = {"kept": False, "failed": None, "throughput": 68.0, "best_before": 100.0,
             "noise": 0.04}
    within = {**worse, "throughput": 102.0}
    small = {**worse, "throughput": 107.0, "noise": 0.01}
    assert outcome(worse) == "worse, reverted"
    assert outcome(within) == "within the noise ±4%, reverted"
    assert outcome(small) == "below the 3% a move must gain, reverted"
    assert outcome({**worse, "failed": "workers killed"}) == "failed: workers killed"
