"""The bound model and the verdicts on constructed measurements (deterministic)."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from monitor.assess import same_runs
from monitor.config import LoaderConfig
from monitor.diagnosis import (
    BoundModel,
    Features,
    best_workers,
    diagnose,
    features,
    fit_bound,
)
from monitor.records import CpuBudget
from monitor.thresholds import MAIN_HANDOFF_S, MAIN_IDLE_CORES
from tests.test_analysis import steps_frame

BUDGET = CpuBudget(affinity=2, quota=None, usable=2, throttled=None, throttled_s=None)


def feat(cfg: LoaderConfig | None = None, **kw) -> Features:
    cfg = cfg or LoaderConfig.build()
    base = dict(
        config=cfg.to_dict(), accelerator="simulated", steps=100, window_s=10.0,
        throughput=200.0, data_wait_share=0.6, device_busy_mean=0.4, device_busy_cv=1.0,
        idle_gaps=50, idle_gap_median_s=0.09,
        period_s=0.15, duty_cycle=0.4, epoch_starts=0, epoch_stall_s=0.0,
        epoch_stall_share=0.0, first_batch_s=None, wait_per_step_s=0.09,
        compute_per_step_s=0.06, copy_share=None, host_cpu_cores=1.0, main_cpu_cores=0.9,
        workers_cpu_cores=None, workers_live=0, other_cpu_cores=0.05,
        cpu_per_sample_s=0.0028, wall_per_sample_s=0.003, usable_cores=2, cpu_quota=None,
        cpu_throttled=None, mem_total_mb=24000.0, mem_available_mb=20000.0,
        memory_budget_mb=None, workload_mem_mb=500.0, worker_rss_mb=None, worker_uss_mb=None,
    )
    base.update(kw)
    # derived as features() derives them, unless a test sets them
    base.setdefault("cpu_busy_fraction", base["host_cpu_cores"] / base["usable_cores"]
                    if base["host_cpu_cores"] is not None else None)
    # the measured split (schedstat, /proc io): a quiet host, no reads, unless a test says
    base.setdefault("runq_per_sample_s", 0.0)
    base.setdefault("read_per_sample_kb", 0.0)
    c, w, q = base["cpu_per_sample_s"], base["wall_per_sample_s"], base["runq_per_sample_s"]
    if "blocked_per_sample_s" not in base:
        base["blocked_per_sample_s"] = max(0.0, w - c - q) \
            if None not in (c, w, q) else None

    def share(x):
        return x / w if x is not None and w else None

    base.setdefault("loading_cpu_per_wall", share(c))
    base.setdefault("loaders_runq_share", share(q))
    base.setdefault("loaders_blocked_share", share(base["blocked_per_sample_s"]))
    if "memory_fraction" not in base:
        budget, total = base["memory_budget_mb"], base["mem_total_mb"]
        used = base["workload_mem_mb"] if budget else total - base["mem_available_mb"]
        base["memory_fraction"] = used / (budget or total)
    return Features(**base)


# -- the bound model -----------------------------------------------------------------------

def test_num_workers_0_alternates_loading_and_compute():
    m = BoundModel(cpu_s=0.002, latency_s=0.0, device_s=0.06, batch_size=32,
                   device_scales=False, overhead_s=0.001, cores=1.9)
    thr, limit = m.predict(0)
    assert thr == pytest.approx(32 / (32 * 0.002 + 0.06)) and limit == "main process"


def test_workers_device_and_cores_bounds():
    m = BoundModel(cpu_s=0.004, latency_s=0.0, device_s=0.06, batch_size=32,
                   device_scales=False, overhead_s=0.001, cores=1.9)
    assert m.predict(1) == (pytest.approx(250.0), "workers")
    thr, limit = m.predict(8)
    assert limit == "cores" and thr == pytest.approx(1.9 / 0.004)
    fast = dataclasses.replace(m, cpu_s=0.0005)
    assert fast.predict(2) == (pytest.approx(32 / 0.061), "device")


def test_storage_latency_lets_workers_beyond_cores_help():
    m = BoundModel(cpu_s=0.0004, latency_s=0.004, device_s=0.03, batch_size=32,
                   device_scales=False, overhead_s=0.001, cores=1.9)
    assert m.predict(4)[0] > 1.9 * m.predict(2)[0]
    assert best_workers(m, 4) == 4


def test_gpu_device_time_scales_with_batch_size():
    m = BoundModel(cpu_s=1e-5, latency_s=0.0, device_s=0.02, batch_size=32,
                   device_scales=True, overhead_s=0.0, cores=8)
    assert m.predict(4, 64)[0] == pytest.approx(m.predict(4, 32)[0])
    sim = dataclasses.replace(m, device_scales=False)
    assert sim.predict(4, 64)[0] == pytest.approx(2 * sim.predict(4, 32)[0])


def test_fit_separates_cpu_from_storage_and_contention():
    io = fit_bound(feat(cpu_per_sample_s=0.0005, wall_per_sample_s=0.0045))
    assert io.latency_s == pytest.approx(0.004) and io.cpu_s == 0.0005
    cfg4 = LoaderConfig.build(num_workers=4)
    # four CPU-bound workers on two cores: each waits for a CPU as long as it runs on one
    # (measured: the run queue), and that wait is no storage latency
    crowded = fit_bound(feat(cfg4, cpu_per_sample_s=0.004, wall_per_sample_s=0.0082,
                             runq_per_sample_s=0.0041, main_cpu_cores=0.05,
                             other_cpu_cores=0.0))
    assert crowded.latency_s < 0.0005
    # without schedstat the split is unknown: no latency is invented
    assert fit_bound(feat(cpu_per_sample_s=0.0005, wall_per_sample_s=0.0045,
                          runq_per_sample_s=None)).latency_s == 0.0
    assert fit_bound(feat(cpu_per_sample_s=None)) is None


# -- verdicts -----------------------------------------------------------------------------

def test_starving_advises_workers_with_a_prediction():
    dg = diagnose(feat())
    assert dg.verdict == "starving"
    a = dg.advice[0]
    assert a.param == "num_workers" and a.value == 2
    assert a.predicted_throughput > 1.5 * 200
    assert "predicted at num_workers=2" in dg.bound["text"]
    assert dg.bound["limit"] == "main process"


def test_workers_from_none_on_short_epochs_come_with_persistent_workers():
    """Epochs that begin within the window (Lightning's 12-batch defaults): the workers
    advised from none are advised kept alive between epochs too, as the tuner's knee move
    does (a bare 12-batch Lightning epoch read 778 samples/s at 2 workers without it against
    826 at none); long epochs get the workers alone."""
    short = [a.param for a in diagnose(feat(epoch_starts=3)).advice]
    assert short[:2] == ["num_workers", "persistent_workers"], short
    assert "persistent_workers" not in [a.param for a in diagnose(feat()).advice]


def test_ranks_on_one_host_share_its_cores_in_the_bound_model():
    """Two ranks of a job on a 2-core host (Lightning DDP, devices=2): each rank's workers
    get its share of the cores, not the host's (before: each rank was predicted +129% at 2
    workers, where a bare run at 2 workers measured 590 -> 378 samples/s)."""
    alone, shared = fit_bound(feat()), fit_bound(feat(local_ranks=2))
    assert shared.cores == pytest.approx((2 - 0.05) / 2 - MAIN_IDLE_CORES)
    assert alone.cores == pytest.approx(2 - 0.05 - MAIN_IDLE_CORES)
    assert shared.predict(2)[0] < alone.predict(2)[0]


def test_a_machines_measured_outcomes_scale_its_predictions():
    """On a machine whose earlier changes measured 0.8 of their predictions, the same window
    predicts 0.8 of the other settings (its own setting's rate, fitted, stays) and says so."""
    f = feat()
    raw = fit_bound(f)
    limit = raw.predict(2)[1]
    seen = fit_bound(f, {limit: 0.8})
    assert seen.predict(0) == raw.predict(0)  # the window's own setting
    assert seen.predict(2)[0] == pytest.approx(0.8 * raw.predict(2)[0])
    other = fit_bound(f, {x: 0.5 for x in ("device", "workers", "cores") if x != limit})
    assert other.predict(2) == raw.predict(2)  # another limit's scale is not this one's
    plain, scaled = diagnose(f).advice[0], diagnose(f, scales={limit: 0.8}).advice[0]
    assert scaled.value == plain.value == 2 and scaled.limit == plain.limit == limit
    assert scaled.predicted_throughput == pytest.approx(0.8 * plain.predicted_throughput)
    assert "x0.80, as this machine's earlier outcomes measured" in scaled.reason
    assert "earlier outcomes" not in plain.reason


def test_threshold_boundary():
    from monitor.thresholds import STARVING_SHARE

    assert diagnose(feat(data_wait_share=STARVING_SHARE)).verdict == "starving"
    assert diagnose(feat(data_wait_share=STARVING_SHARE - 0.01)).verdict == "healthy"


def test_healthy_below_threshold():
    dg = diagnose(feat(data_wait_share=0.03))
    assert dg.verdict == "healthy" and not dg.advice


def test_cpu_bound_never_advises_more_workers():
    cfg = LoaderConfig.build(num_workers=2)
    dg = diagnose(feat(cfg, host_cpu_cores=1.95, workers_cpu_cores=1.9, main_cpu_cores=0.05,
                       cpu_per_sample_s=0.0075, wall_per_sample_s=0.0079))
    assert dg.verdict == "cpu-bound"
    assert all(a.param != "num_workers" for a in dg.advice)
    assert dg.bound["limit"] == "cores"
    # the loaders' share in numbers, not "saturated" (the main process keeps part of it)
    k = fit_bound(feat(cfg, host_cpu_cores=1.95, workers_cpu_cores=1.9, main_cpu_cores=0.05,
                       cpu_per_sample_s=0.0075, wall_per_sample_s=0.0079)).cores_for(2)
    assert f"the loaders get {k:.1f} of 2 usable cores" in dg.bound["text"]
    assert "saturated" not in dg.bound["text"]


def test_io_bound_advises_workers_beyond_cores():
    dg = diagnose(feat(host_cpu_cores=0.3, main_cpu_cores=0.2, cpu_per_sample_s=0.0005,
                       wall_per_sample_s=0.0045, read_per_sample_kb=4.0))
    assert dg.verdict == "io-bound"
    assert "blocked 89% of their time" in dg.headline and "4.0 KB per sample" in dg.headline
    assert dg.advice[0].param == "num_workers" and dg.advice[0].value > 2


def test_blocked_without_reads_is_no_storage_claim():
    """Loaders asleep (a lock, a sleep, a remote call) but reading nothing: starving, with
    the blocked share said; more workers still overlap it."""
    dg = diagnose(feat(host_cpu_cores=0.3, main_cpu_cores=0.2, cpu_per_sample_s=0.0005,
                       wall_per_sample_s=0.0045, read_per_sample_kb=0.0))
    assert dg.verdict == "starving" and "without reading from storage" in dg.headline
    assert "storage)" not in dg.headline and dg.advice[0].value > 2


def test_cpu_contention_is_named_and_still_gets_the_workers_the_scheduler_would_give():
    """num_workers=0 on a host where two other jobs keep the cores busy: the loading waits
    for a CPU half its time. Not storage: contention, said with its figures. The fair
    scheduler shares the cores per runnable process, so workers still take a larger share:
    the setting comes with its predicted gain, beside freeing the cores (issue 31: a busy
    box measured +63% at 2 workers where the product said "more workers will not help")."""
    f = feat(host_cpu_cores=1.9, main_cpu_cores=0.6, other_cpu_cores=1.2,
             cpu_per_sample_s=0.0028, wall_per_sample_s=0.0056, runq_per_sample_s=0.0027,
             others_runnable=2.0)
    dg = diagnose(f)
    assert dg.verdict == "cpu-bound"
    assert dg.headline.startswith("CPU contention: the loaders wait 48% of their time for a "
                                  "CPU; other processes take 1.2 of the 2 usable cores")
    workers = [a for a in dg.advice if a.param == "num_workers"]
    assert len(workers) == 1 and workers[0].value >= 2, dg.advice
    n = workers[0].value
    model = fit_bound(f)
    # K(N) = N U / (N + m + M): the share beside M=2 other runnable processes
    assert model.cores_for(n) == pytest.approx(n * 2 / (n + MAIN_IDLE_CORES + 2.0))
    assert workers[0].predicted_throughput == pytest.approx(model.predict(n)[0])
    assert f"num_workers 0 → {n} predicted +" in dg.headline
    assert "taken from the other jobs" in dg.headline and "2.0 others runnable" in dg.headline
    assert "host" in [a.param for a in dg.advice]  # freeing the cores is still said
    # with the cores idle, the fair share is not what limits: the idle-core figure stands
    quiet = fit_bound(feat(others_runnable=None))
    assert quiet.cores_for(4) == quiet.cores


def test_others_runnable_is_read_from_the_loaders_cpu_wait():
    """T runnable tasks on U cores get U/T each: a loader on a CPU half its runnable time on
    2 cores saw 4 runnable, itself and 3 others; barely waiting, no figure is read."""
    from monitor.diagnosis.features import _others_runnable

    cpu = {"main": 0.5, "main_runq": 0.5, "workers": None, "workers_runq": None, "live": 0}
    assert _others_runnable(cpu, 0, 2) == pytest.approx(3.0)
    assert _others_runnable({**cpu, "main_runq": 0.01}, 0, 2) is None
    assert _others_runnable({**cpu, "main_runq": None}, 0, 2) is None
    # two workers, each on a CPU 0.4 and waiting 0.4 of the window, main 0.1: T = 4, ours
    # = the loader, its sibling (runnable 0.8) and the main process
    two = {"main": 0.1, "main_runq": 0.0, "workers": 0.8, "workers_runq": 0.8, "live": 2}
    assert _others_runnable(two, 2, 2) == pytest.approx(4 - 1 - 0.8 - 0.1)


def test_without_schedstat_the_verdict_says_what_is_missing():
    dg = diagnose(feat(host_cpu_cores=0.3, main_cpu_cores=0.2, cpu_per_sample_s=0.0005,
                       wall_per_sample_s=0.0045, runq_per_sample_s=None,
                       missing_evidence=("CPU wait (no /proc schedstat here)",)))
    assert dg.verdict == "starving" and "Not measured here: CPU wait" in dg.headline


def test_oversubscribed_advises_the_core_count():
    cfg = LoaderConfig.build(num_workers=4)
    dg = diagnose(feat(cfg, host_cpu_cores=2.0, workers_cpu_cores=1.95, main_cpu_cores=0.05,
                       cpu_per_sample_s=0.009, wall_per_sample_s=0.019,
                       runq_per_sample_s=0.0095))
    assert dg.verdict == "oversubscribed"
    assert dg.advice[0].param == "num_workers" and dg.advice[0].value == 2


def test_epoch_stall_advises_persistent_workers():
    cfg = LoaderConfig.build(num_workers=2)
    dg = diagnose(feat(cfg, epoch_starts=5, epoch_stall_s=2.0, epoch_stall_share=0.2,
                       first_batch_s=0.45, workers_cpu_cores=0.6, main_cpu_cores=0.1))
    assert dg.verdict == "epoch-stall"
    assert dg.advice[0].param == "persistent_workers" and dg.advice[0].value is True
    assert dg.advice[0].predicted_throughput == pytest.approx(200 * 10 / 8)
    persistent = LoaderConfig.build(num_workers=2, persistent_workers=True)
    assert diagnose(feat(persistent, epoch_starts=5, epoch_stall_s=2.0,
                         epoch_stall_share=0.2)).verdict != "epoch-stall"


def test_memory_pressure_under_a_budget():
    cfg = LoaderConfig.build(num_workers=4, prefetch_factor=4)
    dg = diagnose(feat(cfg, memory_budget_mb=1000.0, workload_mem_mb=950.0,
                       worker_uss_mb=150.0, workers_cpu_cores=1.0))
    assert dg.verdict == "memory-pressure"
    params = [a.param for a in dg.advice]
    assert params[:2] == ["prefetch_factor", "num_workers"]
    assert dg.advice[1].value == 2 and "300 MB" in dg.advice[1].reason


def test_transfer_bound_on_a_gpu_advises_pin_memory():
    dg = diagnose(feat(accelerator="cuda", copy_share=0.45))
    assert dg.verdict == "transfer-bound" and dg.advice[0].param == "pin_memory"
    pinned = LoaderConfig.build(pin_memory=True)
    assert diagnose(feat(pinned, accelerator="cuda", copy_share=0.45)).verdict != "transfer-bound"


def test_no_data():
    assert diagnose(feat(steps=0, data_wait_share=float("nan"))).verdict == "no data"


# -- features from frames ---------------------------------------------------------------------

def host_frame(t0: float, t1: float, proc: float, workers: float | None, n_workers: int,
               total: float):
    ts = [t0 + i * 0.25 for i in range(int((t1 - t0) / 0.25) + 1)]
    return pd.DataFrame({
        "ts": ts, "cpu_total_pct": total, "cpu_per_core": json.dumps([total, total]),
        "proc_cpu_pct": proc, "workers_cpu_pct": workers, "workers": n_workers,
        "proc_rss_mb": 400.0, "workers_rss_mb": 200.0 * n_workers,
        "workers_uss_mb": 50.0 * n_workers, "shm_used_mb": 10.0, "mem_total_mb": 24000.0,
        "mem_available_mb": 20000.0,
    })


def starved_steps():
    """50 steps of 90 ms wait and 60 ms compute, one epoch; and their span (t0, t1)."""
    steps = steps_frame([0.09] * 50, [0.06] * 50)
    steps["epoch"] = 0
    steps["step"] = range(50)
    return steps, float(steps["ts"].min() - 0.09), float(steps["ts"].max() + 0.06)


def test_features_derive_loading_costs_from_frames():
    steps, t0, t1 = starved_steps()
    host = host_frame(t0, t1, proc=60.0, workers=None, n_workers=0, total=32.0)
    f = features(steps, host, LoaderConfig.build().to_dict(), BUDGET)
    assert f.data_wait_share == pytest.approx(0.6)
    assert f.wall_per_sample_s == pytest.approx(0.09 / 32)
    assert f.cpu_per_sample_s == pytest.approx(0.6 * 7.5 / 1600, rel=0.02)
    assert f.period_s == pytest.approx(0.15, abs=0.05)
    assert f.idle_gaps == 49 and f.idle_gap_median_s == pytest.approx(0.09)
    assert f.host_cpu_cores == pytest.approx(0.64)
    assert f.workload_mem_mb == pytest.approx(400.0)
    assert diagnose(f).verdict == "starving"


def test_a_wait_on_batches_made_ahead_is_the_loops_own_not_blocked_workers():
    """Two workers, 60% of the step waiting: where each step was asked for with a finished
    batch already queued, the wait was the loop receiving them, so the workers'
    idle time is not called blocked, no more workers are predicted to help, and the
    loop-receive finding names it; the same waits with nothing queued (the loop waits for
    its workers) or with later batches held behind a slow one (head-of-line) are not it."""
    from monitor.diagnosis import causes
    from monitor.diagnosis.costs import RECEIVE, loop_receive

    cfg = LoaderConfig.build(num_workers=2).to_dict()
    steps, t0, t1 = starved_steps()
    host = host_frame(t0, t1, proc=30.0, workers=40.0, n_workers=2, total=40.0)
    host["workers_runq_pct"], host["workers_read_kb_s"] = 0.0, 0.0
    report = {"num_workers": 2, "batch_tensors": 20, "sharing_strategy": "file_descriptor"}

    def judged(ready: int, held: int):
        f = features(steps.assign(ready=ready, held=held, worker=[i % 2 for i in range(50)]),
                     host, cfg, BUDGET)
        return f, diagnose(f), causes.find(steps.assign(ready=ready, held=held), host,
                                           report, [], f.throughput, features=f)

    f, dg, found = judged(ready=3, held=0)
    assert f.receive_wait_share == pytest.approx(1.0) and f.receive_wait_s == pytest.approx(0.09)
    assert f.wall_per_sample_s is None and f.loaders_blocked_share is None
    assert not [a for a in dg.advice if a.param == "num_workers" and a.value > 2], dg.advice
    assert dg.bound["limit"] == "device", dg.bound
    assert [x.cause for x in found] == [RECEIVE] and found[0].no_more_workers
    assert found[0].advice[0].value == "file_system sharing"
    # past the line by less than its noise: fed, as the verdict judges it, and nothing to name
    near = dataclasses.replace(f, data_wait_share=0.11, data_wait_se=0.02)
    assert diagnose(near).verdict == "healthy" and loop_receive(report, near) is None
    for ready, held in ((0, 0), (3, 2)):  # waiting for its workers; head-of-line
        f, dg, found = judged(ready, held)
        assert f.receive_wait_share == 0.0 and f.wall_per_sample_s == pytest.approx(2 * 7.5 / 1600)
        assert RECEIVE not in [x.cause for x in found]


def test_the_loops_receipt_says_where_its_thread_was_its_work_or_the_workers_hand_off():
    """NOTE [the loop's receive]: the probe's `wait_cpu_s` and `wait_runq_s` of each receipt
    say where the loop's thread was through the wait on batches made ahead. 90 ms a receipt
    of which 20 ms on a CPU and 15 ms waiting for one: 61% blocked on the worker's own
    threads handing the batch over, and the finding says so, with its figures; 60 ms on a
    CPU: the loop's own work, no word of the hand-off. Steps not measured (0 workers, a
    pinning thread, an older run) leave the split out."""
    from monitor.diagnosis import causes
    from monitor.diagnosis.costs import RECEIVE

    cfg = LoaderConfig.build(num_workers=2).to_dict()
    steps, t0, t1 = starved_steps()
    host = host_frame(t0, t1, proc=30.0, workers=40.0, n_workers=2, total=40.0)
    report = {"num_workers": 2, "batch_tensors": 2, "sharing_strategy": "file_descriptor"}

    def found(**cols):
        s = steps.assign(ready=2, held=0, worker=[i % 2 for i in range(50)], **cols)
        f = features(s, host, cfg, BUDGET)
        return f, [x for x in causes.find(s, host, report, [], f.throughput, features=f)
                   if x.cause == RECEIVE][0]

    f, held = found(wait_cpu_s=0.02, wait_runq_s=0.015)
    assert f.receive_cpu_share == pytest.approx(0.02 / 0.09)
    assert f.receive_runq_share == pytest.approx(0.015 / 0.09)
    assert "its thread on a CPU 22% of that time, waiting for one 17%, and 61% waiting on " \
           "the worker to hand it over, whose own threads send each batch" in held.text, held.text
    assert held.numbers["cpu_share"] == pytest.approx(0.02 / 0.09)
    assert held.advice[0].value == "file_system sharing"  # it ends the sharer's round trips
    _, working = found(wait_cpu_s=0.06, wait_runq_s=0.0)
    assert "on a CPU 67% of that time, waiting for one 0%, and 33% waiting on the worker " \
           "to hand it over)" in working.text, working.text
    f, unmeasured = found(wait_cpu_s=None, wait_runq_s=None)
    assert f.receive_cpu_share is None and "hand it over" not in unmeasured.text
    # no schedstat: the wait for a CPU not measured, the CPU share still said, no split
    f, alone = found(wait_cpu_s=0.02, wait_runq_s=None)
    assert f.receive_cpu_share == pytest.approx(0.02 / 0.09) and f.receive_runq_share is None
    assert "on a CPU 22% of that time)" in alone.text, alone.text
    f, _ = found(wait_cpu_s=0.02)  # (a frame without the column: an older store's)
    assert f.receive_cpu_share == pytest.approx(0.02 / 0.09) and f.receive_runq_share is None
    # read on one receipt in 16 (monitor/probe/thread_clock.py): the share from those
    f, _ = found(wait_cpu_s=0.02, wait_runq_s=[0.03 if i % 16 == 0 else None
                                               for i in range(50)])
    assert f.receive_runq_share is None  # 4 of them: too few
    f, sampled = found(wait_cpu_s=0.02, wait_runq_s=[0.03 if i % 8 == 0 else None
                                                     for i in range(50)])
    assert f.receive_runq_share == pytest.approx(0.03 / 0.09), sampled.text


def test_epoch_starts_are_measured():
    waits = ([0.5] + [0.01] * 9) * 4
    steps = steps_frame(waits, [0.05] * 40)
    steps["epoch"] = [i // 10 for i in range(40)]
    steps["step"] = range(40)
    f = features(steps, pd.DataFrame(), LoaderConfig.build(num_workers=2).to_dict(), BUDGET)
    assert f.epoch_starts == 3 and f.epoch_stall_s == pytest.approx(3 * 0.49)
    assert f.first_batch_s == pytest.approx(0.5)


def test_a_restart_that_slows_a_cpu_steps_first_step_is_an_epoch_stall_not_healthy():
    """tests/scripts/vision_train.py's shape at -j 2 (6 steps an epoch, a step on the host's
    CPU): each epoch's batch comes at once, and its first step takes 0.31 s against 0.05 s
    while the restarted workers take the cores. The data wait is under the line, yet a quarter
    of the time goes at the starts: epoch-stall, persistent_workers advised. On a device
    (or a step that sleeps) the step's own time is not counted as the restart's."""
    waits = [0.003] * 40
    steps = steps_frame(waits, ([0.31] + [0.05] * 9) * 4)
    steps["epoch"] = [i // 10 for i in range(40)]
    steps["step"] = range(40)
    cfg = LoaderConfig.build(num_workers=2).to_dict()
    cpu = features(steps, pd.DataFrame(), cfg, BUDGET, accelerator="cpu")
    assert cpu.epoch_starts == 3 and cpu.epoch_stall_s == pytest.approx(3 * 0.26)
    assert cpu.epoch_stall_step_s == pytest.approx(3 * 0.26)
    assert cpu.data_wait_share < 0.1 and cpu.epoch_stall_share > 0.2
    dg = diagnose(cpu)
    assert dg.verdict == "epoch-stall", dg.headline
    assert "first step then took 0.26 s longer" in dg.headline
    assert (dg.advice[0].param, dg.advice[0].value) == ("persistent_workers", True)
    elsewhere = features(steps, pd.DataFrame(), cfg, BUDGET, accelerator="cuda")
    assert elsewhere.epoch_stall_s == pytest.approx(0.0) and elsewhere.epoch_stall_step_s == 0
    assert diagnose(elsewhere).verdict == "healthy"


def test_cpu_bound_by_other_processes_says_so():
    cfg = LoaderConfig.build(num_workers=0)
    dg = diagnose(feat(cfg, host_cpu_cores=1.95, main_cpu_cores=0.6, other_cpu_cores=1.35))
    assert dg.verdict == "cpu-bound" and "other processes" in dg.headline
    assert dg.advice[0].param == "host" and "1.4 of the 2" in dg.advice[0].reason


def test_features_split_loading_time_from_schedstat_rows():
    """num_workers=0: the main process waited for a CPU 30% of a core and read 40 KB/s; the
    split per sample comes from those rows, not from wall - CPU."""
    steps, t0, t1 = starved_steps()
    host = host_frame(t0, t1, proc=30.0, workers=None, n_workers=0, total=80.0)
    host["proc_runq_pct"], host["proc_read_kb_s"] = 30.0, 40.0
    f = features(steps, host, LoaderConfig.build().to_dict(), BUDGET)
    per = 7.5 / 1600  # window seconds per sample
    assert f.cpu_per_sample_s == pytest.approx(0.3 * per, rel=0.02)
    assert f.runq_per_sample_s == pytest.approx(0.3 * per, rel=0.02)
    assert f.blocked_per_sample_s == pytest.approx(0.09 / 32 - 0.6 * per, rel=0.05)
    assert f.read_per_sample_kb == pytest.approx(40.0 * per, rel=0.02)
    assert f.missing_evidence == ()
    assert f.loading_cpu_per_wall + f.loaders_runq_share + f.loaders_blocked_share == \
        pytest.approx(1.0)


def test_features_without_schedstat_rows_say_what_is_missing():
    steps, t0, t1 = starved_steps()
    host = host_frame(t0, t1, proc=30.0, workers=None, n_workers=0, total=60.0)
    f = features(steps, host, LoaderConfig.build().to_dict(), BUDGET)
    assert f.blocked_per_sample_s is None and f.loaders_blocked_share is None
    assert any("schedstat" in m for m in f.missing_evidence)
    assert diagnose(f).verdict == "starving"  # never io-bound on a guess


def test_tail_stalls_from_a_few_slow_batches():
    """Five of 200 steps wait 1 s (a cold file), the rest 5 ms: the device waits mostly for
    those five, so the verdict is tail stalls with a deeper queue, not more workers."""
    waits = [1.0 if i % 40 == 20 else 0.005 for i in range(200)]
    steps = steps_frame(waits, [0.05] * 200)
    steps["epoch"], steps["step"] = 0, range(200)
    t0, t1 = float(steps["ts"].min() - 1.0), float(steps["ts"].max() + 0.05)
    host = host_frame(t0, t1, proc=30.0, workers=20.0, n_workers=2, total=55.0)
    f = features(steps, host, LoaderConfig.build(num_workers=2).to_dict(), BUDGET)
    assert f.spike_steps == 5 and f.spike_wait_share == pytest.approx(5 / 5.975, rel=1e-3)
    assert f.step_p50_s == pytest.approx(0.055) and f.tail_ratio > 10
    dg = diagnose(f)
    assert dg.verdict == "tail-stalls", dg.headline
    assert "5 of 200 steps" in dg.headline
    top = dg.advice[0]
    assert (top.param, top.value) == ("prefetch_factor", 4)
    lost = f.spike_wait_share * f.data_wait_share * f.window_s  # the stalls' wait
    assert top.predicted_throughput == pytest.approx(
        f.throughput * f.window_s / (f.window_s - lost))
    # the same wait spread evenly over every step: a slow pipeline, not a tail
    even = steps_frame([sum(waits) / 200] * 200, [0.05] * 200)
    even["epoch"], even["step"] = 0, range(200)
    g = features(even, host, LoaderConfig.build(num_workers=2).to_dict(), BUDGET)
    assert g.spike_steps == 0 and diagnose(g).verdict != "tail-stalls"


def test_warm_up_dominates_a_short_run(tmp_path):
    """A run whose first steps took 6 s (start-up) and then 2 s of steady steps: the steady
    state's verdict would hide where the run's time went."""
    from monitor.assess.window import Context, assess, steady_window
    from monitor.records import StepRecord
    from monitor.store import Store

    store = Store(tmp_path / "w.db")
    run = store.create_run("short", "attached", {"num_workers": 0, "batch_size": 8})
    t = 1000.0
    rows = []
    for i, (w, c) in enumerate([(3.0, 0.02), (2.0, 0.02), (1.0, 0.02)] + [(0.005, 0.02)] * 80):
        t += w + c
        rows.append(StepRecord(run, i, 0, t, w, c, 8, 0))
    store.insert(rows)
    store.finish_run(run, "finished")
    w = steady_window(store, run)
    a = assess(w, Context(BUDGET, 6))
    f = a.features
    assert f.warmup_steps == 3 and f.first_step_s == pytest.approx(3.02)
    assert f.warmup_lost_s == pytest.approx(6.06 - 3 * 0.025, rel=0.01)
    assert f.warmup_share == pytest.approx(f.warmup_lost_s / (t - 1000.0), rel=0.01)
    assert a.verdict == "warm-up", a.diagnosis.headline
    assert "first 3 step(s)" in a.diagnosis.headline


def test_each_rank_of_a_job_sheds_its_own_warm_up(tmp_path):
    """Two ranks that started 3 s apart (no process group: each runs its own loop): each
    rank's steady state begins after its own first steps, not at a cut from the earlier
    rank's start, which kept the late rank's start-up and left the early rank a sliver."""
    from monitor.assess.window import steady_window
    from monitor.records import StepRecord
    from monitor.store import Store

    store = Store(tmp_path / "r.db")
    run = store.create_run("job", "attached", {"num_workers": 3, "batch_size": 8})
    rows = []
    for rank, t in ((0, 1000.0), (1, 1003.0)):
        for i in range(100):  # three slow first steps (workers starting), then 20 ms steps
            w = 0.15 if i < 3 else 0.005
            t += w + 0.015
            rows.append(StepRecord(run, i, 0, t, w, 0.015, 8, 0, worker=i % 3, rank=rank))
    store.insert(rows)
    store.finish_run(run, "finished")
    steps = steady_window(store, run).steps
    for rank in (0, 1):
        own = steps[steps["rank"] == rank]
        assert own["wait_s"].max() < 0.15, f"rank {rank} kept its start-up"
        assert 70 <= len(own) <= 97, (rank, len(own))  # most of its 2.4 s, its warm-up shed


def test_a_change_that_recorded_no_step_leaves_the_verdict_with_the_settings_before(tmp_path):
    """num_workers 0 -> 1 applied as the script's time ran out: every stored step is of 0
    workers, so the verdict speaks of 0 workers (not of the final 1) and says why; the run's
    own history has nothing with fewer workers to compare against."""
    from monitor.assess.window import Context, assess, steady_window
    from monitor.records import StepRecord
    from monitor.store import Store

    store = Store(tmp_path / "w.db")
    run = store.create_run("late", "attached", {"num_workers": 1, "batch_size": 8})
    store.add_event(run, "config", "start", {"num_workers": 0, "prefetch_factor": None,
                                            "pin_memory": False, "rank": 0})
    t = 1000.0
    store.insert([StepRecord(run, i, 0, t + 0.025 * i, 0.005, 0.02, 8, 0) for i in range(200)])
    store.add_event(run, "config", "num_workers 0 → 1", {"num_workers": 1, "rank": 0,
                                                         "applied_at_epoch": 1})
    store.finish_run(run, "finished")
    w = steady_window(store, run)
    assert w.run["config"]["num_workers"] == 0 and w.run["config"]["batch_size"] == 8
    assert w.caption.startswith("steady state of the settings before the last change")
    a = assess(w, Context(BUDGET, 6))
    assert a.features.config["num_workers"] == 0
    assert a.diagnosis.headline.endswith("The last change (num_workers 0 → 1) recorded no "
                                         "step before the run ended: this is of the settings "
                                         "before it.")
    assert not [f for f in a.findings if f.cause == "more-workers-slower"]
    # once the change's steps are stored, the window is theirs, and says nothing of it
    store.insert([StepRecord(run, 200 + i, 1, t + 6 + 0.05 * i, 0.03, 0.02, 8, 1)
                  for i in range(100)])
    w = steady_window(store, run)
    assert w.run["config"]["num_workers"] == 1 and not w.note
    assert w.caption.startswith("steady state of the final settings")


def test_advice_for_a_torchdata_nodes_pipeline_is_in_its_terms():
    """No persistent_workers (the API has none): for process workers, one iterator over
    every epoch, with its prediction; for threads, nothing (none start). num_workers is the
    ParallelMapper's, and a thread mapper's gain is not the process-measured model's to
    promise."""
    from monitor.diagnosis.finding import Advice, Diagnosis
    from monitor.diagnosis.kinds import ONE_PASS, in_loader_terms

    dg = Diagnosis("starving", "Starving.", {}, (
        Advice("num_workers", 4, 900.0, "more workers", "cpu", 700.0, 1000.0),
        Advice("persistent_workers", True, 800.0, "keeps workers"),
        Advice("prefetch_factor", 4, None, "deeper")))
    cfg = {"loader_kind": "torchdata.nodes", "worker_method": "process"}
    got = in_loader_terms(dg, cfg).advice
    assert [(a.param, a.value) for a in got] == [
        ("num_workers", 4), ("dataset", ONE_PASS), ("prefetch_factor", 4)]
    assert got[0].reason == "ParallelMapper(num_workers=4): more workers"
    assert got[0].predicted_throughput == 900.0
    assert got[1].predicted_throughput == 800.0 and "itertools.islice" in got[1].reason \
        and got[1].reason.endswith("; it keeps workers"), got[1].reason
    assert got[2].reason.startswith("Prefetcher(prefetch_factor=4): ")
    thread = in_loader_terms(dg, {**cfg, "worker_method": "thread"}).advice
    assert [a.param for a in thread] == ["num_workers", "prefetch_factor"]
    assert thread[0].predicted_throughput is None and thread[0].uncertain
    assert in_loader_terms(dg, {"num_workers": 2}) is dg  # a DataLoader's: as it was


def test_the_demo_page_says_why_it_may_not_starve_as_described_on_a_busy_box():
    """The starving demo is calibrated for the whole box: with other jobs taking cores, the
    page says how many and what that leaves, rather than show the preset's nature wrong."""
    from monitor.ui.demo_note import demo_note

    demo = LoaderConfig.build(preset="starving", num_workers=2)
    assert demo_note(feat(demo, other_cpu_cores=0.1)) is None  # a quiet box: as described
    busy = demo_note(feat(demo, other_cpu_cores=1.6))
    assert busy.startswith("Other jobs on this machine take 1.6 of its 2 cores.") and \
        "with 0.4 cores left, two workers may still starve it" in busy, busy
    assert "should still feed it" in demo_note(feat(demo, other_cpu_cores=0.5))
    other = LoaderConfig.build(preset="cpu-bound", num_workers=2)
    assert demo_note(feat(other, other_cpu_cores=1.6)) is None  # not the demo


def test_oversubscribed_beside_the_sessions_own_neighbours_advises_no_fewer_workers():
    """4 workers on 2 cores beside two busy processes of the job's own session: the extra
    workers win their share from them (bench/predictions.py, same session, 4 -> 2:
    predicted x0.61, bare x0.82), so the advice is not "2 workers", and the headline says
    what fewer would lose; alone in its group the core count is still advised."""
    cfg = LoaderConfig.build(num_workers=4)
    crowded = feat(cfg, host_cpu_cores=2.0, workers_cpu_cores=1.0, main_cpu_cores=0.05,
                   cpu_per_sample_s=0.009, wall_per_sample_s=0.019, runq_per_sample_s=0.0095,
                   other_groups=(), same_group_demand=2.0,
                   group_scans=(((), 2.0),) * 4)
    dg = diagnose(crowded)
    assert dg.verdict == "oversubscribed"
    assert not [a for a in dg.advice if a.param == "num_workers" and a.value < 4]
    assert "fewer workers do not" in dg.headline and "% of the throughput" in dg.headline
    alone = diagnose(dataclasses.replace(crowded, same_group_demand=0.0,
                                         group_scans=(((), 0.0),) * 4))
    assert alone.advice[0].param == "num_workers" and alone.advice[0].value == 2


def test_a_line_crossed_within_its_noise_is_taken_the_way_that_advises_no_change():
    """Two identical runs, one a hair each side of a verdict's line, agree: within
    NOISE_Z standard errors of the line the loaders count as contended and the device as
    fed (a quiet 2-worker run once read "starving, 3 workers" and "cpu-bound" in turn)."""
    cfg = LoaderConfig.build(num_workers=2)
    base = dict(host_cpu_cores=1.3, workers_cpu_cores=1.1, main_cpu_cores=0.2,
                cpu_per_sample_s=0.004, wall_per_sample_s=0.0054, runq_per_sample_s=0.0013)
    below = feat(cfg, **base)  # the loaders wait 24% of their time for a CPU: below 25%
    assert below.loaders_runq_share < 0.25 and diagnose(below).verdict == "starving"
    noisy = dataclasses.replace(below, loaders_runq_se=0.02)
    assert diagnose(noisy).verdict == "cpu-bound"
    plain = dataclasses.replace(below, loaders_runq_se=0.002)
    assert diagnose(plain).verdict == "starving"
    fed = feat(cfg, data_wait_share=0.11, host_cpu_cores=0.6, workers_cpu_cores=0.4)
    assert diagnose(fed).verdict != "healthy"
    within = diagnose(dataclasses.replace(fed, data_wait_se=0.01))
    assert within.verdict == "healthy"
    # the sentence says where 11% stands: not "below 10%" (Ray Train once read "13% of
    # step time (below 10%)")
    assert "11.0% of step time (within the noise of the 10% line: ±2.0%" in within.headline, \
        within.headline
    assert "(below 10%)" in diagnose(feat(cfg, data_wait_share=0.05)).headline


def test_the_noise_of_a_verdicts_figures_is_measured_from_the_window():
    """The standard errors come from the window itself: the data-wait share over runs of
    consecutive steps, the CPU busy and the loaders' CPU wait over the host passes."""
    from monitor.diagnosis.features import _noise
    steady = steps_frame([0.01] * 60, [0.05] * 60)
    jumpy = steps_frame([0.001, 0.05] * 30, [0.05] * 60)
    assert _noise(steady, pd.DataFrame(), 2, None, 0)["data_wait_se"] == pytest.approx(0.0)
    assert _noise(jumpy, pd.DataFrame(), 2, None, 0)["data_wait_se"] < 0.02  # alternation
    bursts = steps_frame([0.001] * 30 + [0.08] * 30, [0.05] * 60)
    assert _noise(bursts, pd.DataFrame(), 2, None, 0)["data_wait_se"] > 0.05
    host = pd.DataFrame({"ts": range(6), "cpu_total_pct": [80, 90, 85, 95, 70, 90],
                         "cpu_per_core": ["[1, 1]"] * 6,
                         "workers_runq_pct": [20, 40, 30, 30, 20, 40]})
    got = _noise(steady, host, 2, 0.3, 2)
    assert 0.02 < got["cpu_busy_se"] < 0.06
    assert got["loaders_runq_se"] == pytest.approx(0.3 * (host["workers_runq_pct"].std()
                                                         / 6 ** 0.5) / 30)


def test_a_step_on_the_hosts_cpu_is_not_the_loops_own_time_and_has_the_cores_at_no_workers():
    """A CPU step on torch's two threads beside two workers (a plain script's 3-layer
    MLP, 32 a batch, measured: 728 samples/s, 0 workers 926-973 bare). The main process's
    CPU in the step is the step's, not the loop's own receiving (at most the wait), so the
    bound reproduces the window; at num_workers=0 the step gets the cores the workers took
    (NOTE [a step on the loaders' CPUs]). A step that sleeps keeps its time; from a window
    at 0, workers are predicted to slow the step they share the CPUs with."""
    cfg = LoaderConfig.build(num_workers=2, batch_size=32)
    cpu_step = dict(accelerator="cpu", steps=100, window_s=100 * 32 / 728, throughput=728.0,
                    data_wait_share=0.066, wait_per_step_s=0.0029, compute_per_step_s=0.0395,
                    host_cpu_cores=1.93, main_cpu_cores=1.59, workers_cpu_cores=0.294,
                    other_cpu_cores=0.0365, main_busy_threads=2.0, cpu_per_sample_s=0.0004,
                    wall_per_sample_s=None, receive_wait_share=0.89, workers_live=2)
    f = feat(cfg, **cpu_step)
    m, dg = fit_bound(f), diagnose(f)
    assert m.step_threads == 2.0
    assert m.overhead_at(2) <= 0.0029 + MAIN_HANDOFF_S  # the loop's own: the wait, at most
    assert dg.bound["predicted_now"] == pytest.approx(728, rel=0.1), dg.bound
    assert m.step_time(0, 32) < 0.75 * 0.0395
    assert m.predict(0)[0] > 728, m.predict(0)
    assert [(a.param, a.value) for a in dg.advice][:1] == [("num_workers", 0)], dg.advice
    # the same window with the step asleep (the main process idle through it)
    asleep = fit_bound(feat(cfg, **{**cpu_step, "main_cpu_cores": 0.1}))
    assert asleep.step_threads == 0 and asleep.step_time(0, 32) == pytest.approx(0.0395)
    assert asleep.predict(0)[0] < 728
    # a window at num_workers=0: the CPU step alone, loading in turn (964 samples/s, 2
    # workers measured 728-765): its workers' CPU comes out of the step's
    cfg0 = LoaderConfig.build(num_workers=0, batch_size=32)
    alone = dict(cpu_step, window_s=100 * 32 / 964, throughput=964.0, data_wait_share=0.23,
                 wait_per_step_s=0.0075, compute_per_step_s=0.025, main_cpu_cores=1.98,
                 workers_cpu_cores=0.0, other_cpu_cores=0.01, cpu_per_sample_s=0.00023,
                 wall_per_sample_s=0.00023, receive_wait_share=None, workers_live=0)
    m0 = fit_bound(feat(cfg0, **alone))
    slept = fit_bound(feat(cfg0, **{**alone, "main_cpu_cores": 0.2}))
    assert m0.step_time(2, 32, loaders_cpu=0.3) > 1.2 * 0.025
    assert m0.predict(2)[0] < 0.9 * slept.predict(2)[0]


def test_a_checkpoint_saved_inside_some_steps_is_the_steps_cpu_not_the_loops_receiving():
    """NOTE [the step's own CPU]: a plain loop over 2 workers that saves a 60 MB checkpoint
    every 25 steps (the window measured: a 1.4 ms median step, 1,437 samples/s). Its CPU is
    the step's: one worker is not predicted faster (measured 23-29% slower bare)."""
    cfg = LoaderConfig.build(num_workers=2, batch_size=16, persistent_workers=True)
    f = feat(cfg, accelerator="cpu", steps=175, window_s=1.95, between_epochs_s=0.001,
             throughput=1437.0, data_wait_share=0.431, wait_per_step_s=0.0048,
             compute_per_step_s=0.0014, host_cpu_cores=1.30, main_cpu_cores=0.625,
             workers_cpu_cores=0.656, other_cpu_cores=0.008, main_busy_threads=1.0,
             cpu_per_sample_s=0.000457, wall_per_sample_s=None, receive_wait_share=0.95,
             receive_wait_s=0.0047, workers_live=2, others_runnable=0.83)
    m, dg = fit_bound(f), diagnose(f)
    assert m.main_cpu_s < 0.001, m.main_cpu_s  # the step's mean (11 ms) taken off, not 1.4
    assert m.predict(1)[0] <= m.predict(2)[0], (m.predict(1), m.predict(2))
    assert "num_workers" not in [a.param for a in dg.advice], dg.advice


def test_an_identical_run_by_the_line_is_judged_as_the_first_was():
    """NOTE [identical runs]: ten identical quiet runs read 9.94-11.20% data wait; a run
    within that spread of an earlier identical one's share takes its side of the line."""
    cfg = LoaderConfig.build(num_workers=2)
    fed_params = dict(host_cpu_cores=0.6, workers_cpu_cores=0.4)
    mine = feat(cfg, data_wait_share=0.1056, data_wait_se=0.0015, **fed_params)
    assert not mine.fed and diagnose(mine).verdict != "healthy"  # alone: above its noise
    first = {"run": 1, "share": 0.1016, "se": 0.0012, "fed": True, "config": cfg.to_dict(),
             "verdict": "healthy"}
    held = same_runs.anchor(mine, (first,))
    assert held.fed and held.judged_as == {"run": 1, "share": 0.1016, "fed": True}
    dg = diagnose(held)
    assert dg.verdict == "healthy", dg.headline
    assert "10.6% of step time (within identical runs' spread of the 10% line)" in \
        dg.headline
    said = same_runs.sentence(held)
    assert "as run 1 was" in said and "(10.2%)" in said and "(10.6%)" in said
    # the earliest identical run within the spread decides, not the latest
    later = {**first, "run": 2, "share": 0.109, "fed": False, "verdict": "loop-receive"}
    assert same_runs.anchor(mine, (first, later)).judged_as["run"] == 1
    # figures that moved beyond the spread (a busier box), other settings: judged alone
    far = feat(cfg, data_wait_share=0.14, data_wait_se=0.0015, **fed_params)
    assert same_runs.anchor(far, (first,)) is far
    other = feat(LoaderConfig.build(num_workers=3), data_wait_share=0.1056,
                 data_wait_se=0.0015, **fed_params)
    assert same_runs.anchor(other, (first,)) is other
    # the other way: an earlier run judged starved keeps a run just under the line starved
    starved = {**first, "share": 0.108, "fed": False}
    under = feat(cfg, data_wait_share=0.099, data_wait_se=0.002, **fed_params)
    assert under.fed and not same_runs.anchor(under, (starved,)).fed
    # the same side: nothing to say
    assert same_runs.anchor(feat(cfg, data_wait_share=0.098, data_wait_se=0.001,
                                 **fed_params), (first,)).judged_as is None


def test_identical_runs_by_the_line_with_a_main_pool_read_one_cause():
    """NOTE [threads at work], NOTE [identical runs]: the main process's pool is named only
    where the device is not fed by the verdict's own line. Two identical runs beside a main
    pool at 9.95% and 10.56% data wait, the second judged fed as the first was: both
    healthy, neither with the pool's cause (the second read `main-threads` under a healthy
    verdict when the finding checked the raw 10% line); past the line and its noise, named."""
    from monitor.diagnosis import causes
    from monitor.diagnosis.threads import MAIN_THREADS, threads_fight

    cfg = LoaderConfig.build(num_workers=2)
    pool = dict(host_cpu_cores=1.9, workers_cpu_cores=0.9, main_cpu_cores=1.0,
                cpu_busy_fraction=0.97, loaders_runq_share=0.35, worker_busy_threads=1.0,
                main_busy_threads=2.0, loading_cpu_per_wall=0.45)

    def read(f: Features):
        found = tuple(x for x in (threads_fight(f),) if x is not None)
        return causes.with_findings(diagnose(f), found, f, 2)

    first = feat(cfg, data_wait_share=0.0995, data_wait_se=0.0012, **pool)
    record = {"run": 1, "share": 0.0995, "se": 0.0012, "fed": first.fed,
              "config": cfg.to_dict(), "verdict": "healthy"}
    second = same_runs.anchor(feat(cfg, data_wait_share=0.1056, data_wait_se=0.0015, **pool),
                              (record,))
    assert first.fed and second.judged_as is not None
    one, two = read(first), read(second)
    assert (one.verdict, one.cause) == (two.verdict, two.cause) == ("healthy", None), \
        (one.headline, two.headline)
    # a share a tenth would round onto the line reads with its hundredths
    assert "data wait is 9.95% of step time (below 10%)" in one.headline, one.headline
    starved = read(feat(cfg, data_wait_share=0.16, data_wait_se=0.0015, **pool))
    assert starved.cause == MAIN_THREADS, starved.headline
