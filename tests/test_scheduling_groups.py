"""The scheduling groups behind a prediction (NOTE [scheduling groups] in
monitor/sampling/groups.py): the scan reads each other process's demand and group from a
/proc tree, and the bound model shares the cores between groups before tasks, so more
workers take CPU from a neighbour in the job's own group and none from one in another."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from monitor.diagnosis import diagnose
from monitor.diagnosis.bound import BoundModel, waterfill
from monitor.diagnosis.features import _groups
from monitor.sampling.groups import KTHREAD_EVERY, PF_KTHREAD, GroupScan, group_of
from tests.conftest import wait_for


def test_waterfill_shares_by_weight_and_gives_back_what_a_claim_leaves():
    assert waterfill(2.0, [(1, 3.0), (1, 2.0)]) == pytest.approx([1.0, 1.0])
    assert waterfill(2.0, [(1, 3.0), (1, 0.5)]) == pytest.approx([1.5, 0.5])
    assert waterfill(2.0, [(2, 3.0), (1, 3.0)]) == pytest.approx([4 / 3, 2 / 3])
    assert waterfill(2.0, [(1, 0.2), (1, 0.3)]) == pytest.approx([0.2, 0.3])
    assert waterfill(2.0, [(1, 0.0), (1, 5.0)]) == pytest.approx([0.0, 2.0])


def model(**kw) -> BoundModel:
    base = dict(cpu_s=0.0008, latency_s=0.0, device_s=0.005, batch_size=16,
                device_scales=False, overhead_s=0.001, cores=0.5, usable=2.0,
                main_runnable=0.05, main_cpu_s=0.0007)
    return BoundModel(**{**base, **kw})


def test_a_neighbour_in_another_group_keeps_its_share_whatever_the_workers():
    """Two busy processes of another session's job (one group, demand 2): the job's group
    gets one of two cores at 2 workers and at 6 alike."""
    m = model(groups=((1.0, 2.0),))
    assert m.cores_for(2) == pytest.approx(m.cores_for(6), rel=0.05)
    assert m.cores_for(2) == pytest.approx(0.95, abs=0.06)  # a core, less the main process
    assert m.predict(6)[0] == pytest.approx(m.predict(2)[0], rel=0.05)


def test_a_neighbour_in_the_jobs_own_group_loses_cores_to_more_workers():
    """The same two busy processes in the job's own group: per task, so 6 workers take more
    than 2 (the per-task model, which held for neighbours of one session)."""
    m = model(groups=(), same_demand=2.0)
    assert m.cores_for(6) > 1.3 * m.cores_for(2)
    assert m.cores_for(2) == pytest.approx(2 * 2 / 4.05, rel=0.05)


def test_the_main_process_is_a_ceiling_and_shares_a_core_at_no_workers():
    """Beside workers, the main process's receiving is in series with the step: no setting
    predicts past b / (d + o); at num_workers=0 it loads at its share of a core."""
    m = model(cpu_s=0.0001, main_cpu_s=0.003)
    assert m.predict(8)[0] <= 16 / (0.005 + 0.003) + 1e-6
    quiet, busy = model(groups=()), model(groups=((1.0, 2.0), (1.0, 1.0)))
    assert busy.predict(0)[0] < 0.8 * quiet.predict(0)[0]


def _proc(tmp: Path, pid: int, cpu_ticks: int, runq_ns: int, autogroup: str,
          cgroup: str = "1:cpu:/\n0::/\n", flags: int = 0) -> None:
    d = tmp / str(pid)
    d.mkdir(exist_ok=True)
    fields = ["S"] + ["0"] * 5 + [str(flags)] + ["0"] * 4 + [str(cpu_ticks), "0"] + \
        ["0"] * 4 + ["1"] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (x) " + " ".join(fields) + "\n")
    (d / "schedstat").write_text(f"{cpu_ticks * 10_000_000} {runq_ns} 5\n")
    (d / "autogroup").write_text(autogroup)
    (d / "cgroup").write_text(cgroup)


def test_the_scan_sums_each_groups_demand_from_proc(tmp_path):
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "sched_autogroup_enabled").write_text("1\n")
    cg = tmp_path / "cg" / "cpu" / "batch"
    cg.mkdir(parents=True)
    (cg / "cpu.shares").write_text("2048\n")
    clock = [100.0]
    scan = GroupScan(proc=str(tmp_path), root=str(tmp_path / "cg"), clock=lambda: clock[0],
                     every_s=1.0)
    scan.tick = 100
    procs = {1: "/autogroup-1 nice 0\n", 2: "/autogroup-7 nice 0\n",
             3: "/autogroup-7 nice 0\n"}
    for pid, ag in procs.items():
        _proc(tmp_path, pid, 0, 0, ag)
    _proc(tmp_path, 4, 0, 0, "/autogroup-9 nice 0\n", cgroup="1:cpu:/batch\n")
    kthread = {"autogroup": "/autogroup-3 nice 0\n", "flags": PF_KTHREAD}
    _proc(tmp_path, 5, 0, 0, **kthread)
    assert scan.sample({1}, 1) is None  # the first scan: nothing to compare with
    clock[0] += 2.0
    for pid in (2, 3):  # a core each for 2 s, half a second waiting
        _proc(tmp_path, pid, 200, 500_000_000, procs[pid])
    _proc(tmp_path, 4, 100, 0, "/autogroup-9 nice 0\n", cgroup="1:cpu:/batch\n")
    _proc(tmp_path, 5, 100, 1_500_000_000, **kthread)  # its wait is not read: its CPU is
    out = json.loads(scan.sample({1}, 1))
    assert out["own"] == "autogroup:1"
    got = {k: (w, d, u, n) for k, w, d, u, n in out["groups"]}
    assert got["autogroup:7"] == pytest.approx((1.0, 2.0, 2.0, 2))  # capped: a core a thread
    assert got["cgroup:/batch"] == pytest.approx((2.0, 0.5, 0.5, 1))
    assert "autogroup:3" not in got  # a kernel thread: read at its first sight, then at its
    assert group_of(4, str(tmp_path), str(tmp_path / "cg")) == ("cgroup:/batch", 2.0)
    turn = next(n for n in range(1, KTHREAD_EVERY + 1) if (5 + n) % KTHREAD_EVERY == 0)
    stat = tmp_path / "5" / "stat"
    for n in range(scan.scans, turn + 2):  # turn in KTHREAD_EVERY scans: not read between
        clock[0] += 2.0
        if n == turn:
            _proc(tmp_path, 5, 400, 1_500_000_000, **kthread)
        else:
            stat.unlink(missing_ok=True)  # (read now, it would be a process gone)
        got = {k: (w, d, u, c) for k, w, d, u, c in json.loads(scan.sample({1}, 1))["groups"]}
        if n < turn:
            assert "autogroup:3" not in got
        else:  # 4 s of CPU over the 2 * (turn - 1) + 2 s since its first read, held after
            cores = 4.0 / (2.0 * turn)
            assert got["autogroup:3"] == pytest.approx((1.0, cores, cores, 1))


def test_the_window_reads_each_groups_mean_demand_and_the_spread():
    rows = [{"ts": t, "others_groups": json.dumps({"own": "a", "own_weight": 1.0, "groups": [
        ["a", 1.0, 0.5, 0.5, 1], ["b", 1.0, 2.0 if t % 2 else 1.0, 1.0, 2]]})}
        for t in range(10)]
    g = _groups(pd.DataFrame(rows))
    assert g["same_group_demand"] == pytest.approx(0.5)
    assert len(g["other_groups"]) == 1 and g["other_groups"][0] == pytest.approx((1.0, 1.5))
    assert g["others_demand"] == pytest.approx((1.5, 2.0, 2.5))


def test_a_real_neighbour_in_another_session_is_a_group_of_its_own():
    """A busy process started in a session of its own (`setsid`), as another user's job is:
    the scan finds it outside this process's group."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        scan = GroupScan(every_s=0.0)
        scan.sample(set(), None)
        mine = group_of(busy.pid)
        seen: list[dict] = []

        def busy_seen() -> bool:
            seen[:] = [json.loads(scan.sample(set(), None) or '{"groups": []}')]
            return any(k == mine[0] and d > 0.1 for k, _, d, *_ in seen[0]["groups"])
        assert wait_for(busy_seen, timeout=20, every=0.2), seen
        assert mine[0] != group_of(__import__("os").getpid())[0] or mine[0].startswith(
            "cgroup:") or mine[0] == "/", mine
    finally:
        busy.kill()
        busy.wait()


def test_a_neighbour_that_runs_and_pauses_is_predicted_scan_by_scan():
    """Two busy sessions and one busy 2 s, idle 2 s: the job's group gets 0.5 of a core
    while the third runs and 0.67 while it pauses; the prediction is the mean of the two,
    not the share at its mean demand (0.5), and the range spans them."""
    busy = ((1.0, 1.0), (1.0, 1.0), (1.0, 1.0))
    idle = ((1.0, 1.0), (1.0, 1.0))
    m = model(scans=((busy, 0.0), (idle, 0.0)) * 5, groups=busy[:2] + ((1.0, 0.5),),
              main_runnable=0.0)
    at_busy = model(groups=busy, main_runnable=0.0).predict(2)[0]
    at_idle = model(groups=idle, main_runnable=0.0).predict(2)[0]
    assert at_idle > 1.2 * at_busy
    assert m.predict(2)[0] == pytest.approx((at_busy + at_idle) / 2)
    assert m.span(2) == pytest.approx((at_busy, at_idle))


def test_the_monitors_own_cpu_is_taken_off_the_base_of_a_gain():
    """The monitor's processes run in the job's own scheduling group (`monitor run` shares
    the script's session): their CPU took a share from the loaders the bare run has. A
    gain is a percentage of the window's rate without it, and says its base; with the
    groups not measured it cannot be separated, and the base is the window's own rate."""
    contended = model(groups=((1.0, 2.0),), same_demand=0.0, fit_workers=2)
    assert contended.bare_factor() == 1.0  # no monitor CPU measured
    busy = dataclasses.replace(contended, monitor_cpu=0.4)
    assert busy.bare_factor() > 1.1  # the loaders' group share is split with 0.4 cores more
    assert dataclasses.replace(busy, groups=None).bare_factor() == 1.0

    from tests.test_diagnosis import feat
    f = feat(other_groups=((1.0, 1.0),), same_group_demand=0.0,
             group_scans=((((1.0, 1.0),), 0.0),) * 4, monitor_cpu_cores=0.2)
    adv = next(a for a in diagnose(f).advice if a.param == "num_workers")
    assert adv.base_throughput > 1.05 * f.throughput
    assert "without the monitor's own 0.20 cores of CPU" in adv.reason
    pct = round((adv.predicted_throughput / adv.base_throughput - 1) * 100)
    assert f"{pct:+d}% over {adv.base_throughput:,.0f} samples/s" in adv.reason
    quiet = diagnose(dataclasses.replace(f, monitor_cpu_cores=0.0))
    adv = next(a for a in quiet.advice if a.param == "num_workers")
    assert adv.base_throughput == f.throughput
    assert "over this window's 200 samples/s" in adv.reason
