"""Host sampling: a real process tree, a vanished process, a failing psutil field."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import psutil
import pytest

from monitor.sampling.host import TREE_EVERY, HostSampler
from tests.conftest import wait_for

TREE = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2)]
try:
    time.sleep(60)  # sleep-ok: the tree lives until the test kills it
finally:
    for k in kids: k.kill()
"""


@pytest.fixture
def tree():
    p = subprocess.Popen([sys.executable, "-c", TREE])
    wait_for(lambda: len(psutil.Process(p.pid).children()) >= 2, timeout=20, every=0.05)
    yield p
    for c in psutil.Process(p.pid).children(recursive=True):
        c.kill()
    p.kill()
    p.wait()


def test_counts_workers_and_their_cpu(tree):
    s = HostSampler()
    s.follow(tree.pid, run_id=7)
    kids = psutil.Process(tree.pid).children()

    def used() -> tuple[float, float]:
        return time.monotonic(), sum(sum(k.cpu_times()[:2]) for k in kids)
    t0, c0 = used()
    s.sample()
    time.sleep(1.0)  # sleep-ok: cpu_percent measures CPU over this interval
    rec = s.sample()
    t1, c1 = used()
    assert rec.run_id == 7 and rec.workers == 2
    # two busy loops: what they really got of the cores (all of two on a quiet box, far
    # less beside other jobs), as their own CPU times say over the same second
    assert rec.workers_cpu_pct == pytest.approx(100 * (c1 - c0) / (t1 - t0), rel=0.3, abs=5)
    assert rec.workers_rss_mb > 1 and rec.proc_rss_mb > 1
    # each worker on its own, summing to the workers' figures
    each = json.loads(rec.workers_detail)
    assert sorted(w["pid"] for w in each) == sorted(k.pid for k in
                                                   psutil.Process(tree.pid).children())
    assert sum(w["cpu_pct"] for w in each) == pytest.approx(rec.workers_cpu_pct, rel=0.05)
    assert sum(w["rss_mb"] for w in each) == pytest.approx(rec.workers_rss_mb)
    assert all(w["status"] in ("running", "sleeping") for w in each)
    cores = json.loads(rec.cpu_per_core)
    assert len(cores) == psutil.cpu_count() and rec.mem_total_mb > rec.mem_used_mb > 0
    # the three a many-core host's chart draws, of the readings stored beside them
    assert (rec.cpu_busiest_core_pct, rec.cpu_median_core_pct, rec.cpu_idlest_core_pct) == \
        (max(cores), float(np.median(cores)), min(cores))


SPAWN = """
import subprocess, sys
sys.stdin.readline()
kid = subprocess.Popen([sys.executable, '-c', 'while True: pass'])
try:
    sys.stdin.readline()
finally:
    kid.kill()
"""


def test_a_worker_started_between_scans_is_counted_from_its_start():
    """A worker spawned just after a descendant scan is found only at the next one
    (TREE_EVERY passes on), and psutil's cpu_percent drops a new process's first interval:
    its CPU until then would read as other processes' load (a new DataLoader worker's first
    second, on epochs of a second). Summed over the passes, the workers' CPU holds all of
    it."""
    p = subprocess.Popen([sys.executable, "-c", SPAWN], stdin=subprocess.PIPE, text=True)
    try:
        s = HostSampler()
        s.follow(p.pid, run_id=1)
        s.sample()  # a scan: no workers yet
        last = time.time()
        p.stdin.write("\n")
        p.stdin.flush()
        wait_for(lambda: psutil.Process(p.pid).children(), timeout=20, every=0.02)
        kid = psutil.Process(p.pid).children()[0]
        total = 0.0
        for _ in range(TREE_EVERY + 2):
            time.sleep(0.25)  # sleep-ok: the sampler's own cadence between passes
            rec = s.sample()
            now = time.time()
            total += (rec.workers_cpu_pct or 0.0) / 100 * (now - last)
            last = now
        used = sum(kid.cpu_times()[:2])
        # (beside other jobs the loop gets what the cores leave it: 0.14 s here with both
        # cores busy; what is asserted is that the sampler counted all of it)
        assert rec.workers == 1 and used > 0
        assert total == pytest.approx(used, rel=0.2, abs=0.03)
    finally:
        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait()


def test_vanished_process_is_missing_not_an_error():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    s = HostSampler()
    s.follow(p.pid, run_id=1)
    rec = s.sample()
    assert rec.workers is None and rec.proc_cpu_pct is None
    assert rec.cpu_total_pct is not None  # the host part still reads


def test_failing_field_degrades_to_none():
    fake = types.SimpleNamespace(
        cpu_percent=lambda percpu=False: [10.0, 30.0],
        virtual_memory=lambda: (_ for _ in ()).throw(PermissionError("denied")),
        Process=psutil.Process,
    )
    s = HostSampler(psutil=fake, shm_path="/nonexistent/shm", clock=lambda: 42.0)
    rec = s.sample()
    assert rec.ts == 42.0 and rec.cpu_total_pct == 20.0
    assert rec.mem_used_mb is None and rec.shm_used_mb is None and rec.workers is None


def _files(root, files: dict[str, str]):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_cpu_budget_cgroup_v2_quota_and_throttling(tmp_path):
    from monitor.sampling.budget import cpu_budget

    root = _files(tmp_path, {
        "cpu.max": "150000 100000\n",
        "cpu.stat": "usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\n"
                    "nr_periods 200\nnr_throttled 50\nthrottled_usec 2500000\n",
    })
    b = cpu_budget(root, affinity=8)
    assert (b.affinity, b.quota, b.usable) == (8, 1.5, 2)
    assert b.throttled == 0.25 and b.throttled_s == 2.5


def test_cpu_budget_cgroup_v2_unlimited(tmp_path):
    from monitor.sampling.budget import cpu_budget

    root = _files(tmp_path, {"cpu.max": "max 100000\n", "cpu.stat": "usage_usec 1\n"})
    b = cpu_budget(root, affinity=4)
    assert (b.quota, b.usable, b.throttled) == (None, 4, None)


def test_cpu_budget_cgroup_v1(tmp_path):
    from monitor.sampling.budget import cpu_budget

    root = _files(tmp_path, {
        "cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n",
        "cpu/cpu.stat": "nr_periods 10\nnr_throttled 9\nthrottled_time 3000000000\n",
    })
    b = cpu_budget(root, affinity=16)
    assert (b.quota, b.usable) == (1.0, 1)
    assert b.throttled == 0.9 and b.throttled_s == 3.0
    v1_unlimited = _files(tmp_path / "u", {"cpu/cpu.cfs_quota_us": "-1\n",
                                          "cpu/cpu.cfs_period_us": "100000\n"})
    assert cpu_budget(v1_unlimited, affinity=2).usable == 2


def test_cpu_budget_without_cgroup_files_uses_affinity(tmp_path):
    from monitor.sampling.budget import cpu_budget

    b = cpu_budget(str(tmp_path / "none"), affinity=3)
    assert (b.usable, b.quota, b.throttled, b.throttled_s) == (3, None, None, None)


RANK = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])  # sleep-ok
kids = [worker]
if sys.argv[1] == '0':  # rank 0 starts rank 1, as Lightning's DDP launcher does
    kids.append(subprocess.Popen([sys.executable, __file__, '1'], stdout=sys.stdout))
print(sys.argv[1], __import__('os').getpid(), worker.pid, flush=True)
try:
    sys.stdin.readline() if sys.argv[1] == '0' else __import__('time').sleep(60)  # sleep-ok
finally:
    for k in kids: k.kill()
"""


def test_a_rank_that_is_the_followed_process_gets_its_row_and_only_its_workers(tmp_path):
    """Lightning's DDP launcher: rank 0 is the script's own process and rank 1 its child.
    Each rank gets its own row with its own worker; rank 1 and its worker are never rank
    0's workers (before: rank 0 had no row, its CPU read as other processes' load)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    p = subprocess.Popen([sys.executable, str(script), "0"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        lines = [p.stdout.readline().split() for _ in range(2)]
        seen = {int(a[0]): (int(a[1]), int(a[2])) for a in lines}  # rank: (pid, worker)
        s = HostSampler()
        s.follow(p.pid, run_id=3)
        s.follow_ranks({0: seen[0][0], 1: seen[1][0]})
        assert seen[0][0] == p.pid  # rank 0 is the followed process
        s.sample_all()
        def rows():  # the tree is rescanned at a pass: poll until each rank has its worker
            r = s.sample_all()
            return r if [(x.rank, x.workers) for x in r] == [(0, 1), (1, 1)] else None

        got = wait_for(rows, timeout=10, every=0.25)
        assert got, [(x.rank, x.workers) for x in s.sample_all()]
    finally:
        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait()


def test_the_monitors_own_processes_are_counted_apart_from_the_job_and_other_processes(
        tree):
    """A process of the monitor's (here one named starvation-monitor that keeps a core busy)
    is found by its command line: its CPU is on a line of its own, and the verdict's "other
    processes" leaves it out; the watched job's own processes are never counted there."""
    from monitor.diagnosis.features import _cpu
    from monitor.sampling.own import is_monitor

    assert is_monitor(["/usr/bin/python3", "-m", "monitor", "run", "--", "python", "t.py"])
    assert is_monitor(["/venv/bin/starvation-monitor", "run"])
    assert is_monitor(["python", "-m", "streamlit", "run", "/src/app.py"])
    assert not is_monitor(["python", "train.py", "-m", "monitor"])
    ours = subprocess.Popen(["bash", "-c", "exec -a starvation-monitor "
                             f"{sys.executable} -c 'while True: pass'"])
    try:
        wait_for(lambda: is_monitor(psutil.Process(ours.pid).cmdline()), timeout=20)
        s = HostSampler()
        s.follow(tree.pid, run_id=7)
        rows = []
        spin = psutil.Process(ours.pid)
        kids = psutil.Process(tree.pid).children()

        def kids_cpu() -> float:
            return sum(sum(k.cpu_times()[:2]) for k in kids)
        t0, c0, k0 = time.monotonic(), sum(spin.cpu_times()[:2]), kids_cpu()
        assert wait_for(lambda: rows.append(s.sample()) or (
            len(rows) > 8 and (rows[-1].monitor_cpu_pct or 0) > 0), timeout=30, every=0.25), \
            [r.monitor_cpu_pct for r in rows]
        dt = time.monotonic() - t0
        got = 100 * (sum(spin.cpu_times()[:2]) - c0) / dt
        kids_got = (kids_cpu() - k0) / dt  # cores, as the workers' own times say
        # the spinner's CPU, as its own times say (all of a core quiet, 10-17% of one beside
        # a busy suite), is on the monitor's line (with this sampler's own)
        seen = [r.monitor_cpu_pct for r in rows[1:] if r.monitor_cpu_pct is not None]
        assert sum(seen) / len(seen) >= 0.7 * got, (seen, got)
        import pandas as pd

        frame = pd.DataFrame([{c: getattr(r, c) for c in (
            "cpu_total_pct", "cpu_per_core", "proc_cpu_pct", "workers_cpu_pct", "workers",
            "monitor_cpu_pct")} for r in rows[2:]])
        cpu = _cpu(frame)
        # both spinners measured, each on its own line, as their own CPU times say (a busy
        # suite shares the 2 cores among more spinners than these: 0.29 of a core once, 0.09
        # once), and "other" is the rest
        assert cpu["monitor"] >= 0.6 * got / 100 and cpu["workers"] >= 0.6 * kids_got, \
            (cpu, got, kids_got)
        assert cpu["monitor"] > 0 and cpu["workers"] > 0, cpu
        assert cpu["other"] == pytest.approx(max(0.0, cpu["host"] - cpu["main"] -
                                                 cpu["workers"] - cpu["monitor"]))
    finally:
        ours.kill()
        ours.wait()


def test_the_cpu_budget_keeps_within_slurms_grant(tmp_path):
    """SLURM_CPUS_PER_TASK bounds the usable cores where no mask or cgroup enforces it;
    outside a Slurm job, or unset, it is not read."""
    from monitor.sampling.budget import cpu_budget

    granted = {"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "2"}
    b = cpu_budget(str(tmp_path), affinity=16, env=granted)
    assert (b.usable, b.scheduler, b.affinity) == (2, 2, 16)
    # a grant above the mask leaves the mask the limit
    assert cpu_budget(str(tmp_path), affinity=1, env=granted).usable == 1
    assert cpu_budget(str(tmp_path), affinity=16, env={"SLURM_CPUS_PER_TASK": "2"}).usable \
        == 16
    assert cpu_budget(str(tmp_path), affinity=16, env={"SLURM_JOB_ID": "7"}).scheduler is None
    assert cpu_budget(str(tmp_path), affinity=16,
                      env={**granted, "SLURM_CPUS_PER_TASK": "x"}).usable == 16


class _Worker:
    """A worker whose USS the test sets, counting the reads of it (smaps_rollup)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.uss, self.reads = pid, 100.0, 0
        self._real = psutil.Process(pid)

    def memory_full_info(self):
        self.reads += 1
        return types.SimpleNamespace(uss=self.uss * 1024 * 1024)

    def __getattr__(self, name):  # the rest read the real process (this one)
        return getattr(self._real, name)


def _uss_passes(s: HostSampler, main, workers: list, n: int, each=lambda: None) -> list[int]:
    """`n` sampler passes over `workers` (`each` before every pass): each worker's USS reads."""
    before = [w.reads for w in workers]
    for _ in range(n):
        each()
        s._process_fields(0, main, workers)
        s._passes += 1
    return [w.reads - b for w, b in zip(workers, before, strict=True)]


def test_a_flat_uss_is_read_less_often_and_a_rise_restores_the_rate():
    """smaps_rollup is a pass's costliest read: a worker is read every USS_EVERY passes a
    worker, USS_BACKOFF times less often after a read that rose USS_RISE_MB or less; a rise
    (a cache that starts to grow) brings the full rate back at the next read."""
    from monitor.sampling.host import USS_BACKOFF, USS_EVERY

    s = HostSampler()
    main, w = psutil.Process(os.getpid()), _Worker(os.getpid())
    assert _uss_passes(s, main, [w], 1) == [1]  # a new set of workers: at once
    assert _uss_passes(s, main, [w], USS_EVERY) == [1]  # the next at the full rate: flat
    slow = USS_EVERY * USS_BACKOFF
    assert _uss_passes(s, main, [w], slow * 2) == [2]  # ... so backed off
    w.uss += 50  # it grows: seen at the next (slow) read, then the full rate again
    assert _uss_passes(s, main, [w], slow) == [1]
    w.uss += 50
    assert _uss_passes(s, main, [w], USS_EVERY * 2) == [2]  # a rise, then flat
    assert s._uss[0] == 200.0


@pytest.fixture
def two_workers():
    """Two real processes (sleeping) as workers whose USS the test sets."""
    idle = "import time; time.sleep(120)"  # sleep-ok: the worker itself, killed after
    procs = [subprocess.Popen([sys.executable, "-c", idle]) for _ in range(2)]
    yield [_Worker(p.pid) for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def test_a_growing_worker_keeps_the_full_rate_beside_a_flat_one(two_workers):
    """Each worker's own last read sets its rate: the one growing is read every USS_EVERY
    passes a worker, the flat one USS_BACKOFF times less often; the total is each one's as
    last read."""
    from monitor.sampling.host import USS_BACKOFF, USS_EVERY

    s, main = HostSampler(), psutil.Process(os.getpid())
    grow, flat = two_workers

    def more() -> None:
        grow.uss += 5.0  # 5 MB a pass: 20 MB/s

    full = USS_EVERY * 2  # two workers: each in turn
    n = 1 + full * 6  # the new set's read, then six of the full rate's turns
    got = _uss_passes(s, main, [grow, flat], n, more)
    # growing: at once, then every `full` passes; flat: at once, at its first turn
    # (USS_EVERY passes after the growing one's: flat), then USS_BACKOFF turns later
    first = full + USS_EVERY
    assert got == [1 + 6, 1 + 1 + (n - 1 - first) // (full * USS_BACKOFF)]
    assert s._uss[0] == pytest.approx(grow.uss + flat.uss)  # (the last pass read it)


def test_workers_that_start_passes_apart_are_each_read_once_and_one_gone_leaves_the_total(
        two_workers):
    """A worker not read yet is read at once, the others not again (a DataLoader's workers
    start a pass or two apart); a worker gone takes its USS out of the total at once."""
    s, main = HostSampler(), psutil.Process(os.getpid())
    a, b = two_workers
    b.uss = 40.0
    assert _uss_passes(s, main, [a], 1) == [1]
    assert _uss_passes(s, main, [a, b], 1) == [0, 1]  # only the new one
    assert s._uss[0] == 140.0
    assert _uss_passes(s, main, [a], 1) == [0]  # b gone: no read, its part out
    assert s._uss[0] == 100.0


def test_a_new_descendant_is_found_in_the_groups_scan_without_a_scan_of_its_own(monkeypatch):
    """A process the job starts without a thread of its own more (so no scan at once) is
    found in the parents the scheduling-groups scan read (the same /proc files, once a
    second), not by a scan of every process of its own (psutil's children())."""
    p = subprocess.Popen([sys.executable, "-c", SPAWN], stdin=subprocess.PIPE, text=True)
    try:
        s = HostSampler()
        s._scan.every_s = 0.0  # (a scan each pass: the test need not wait a second)
        s.follow(p.pid, run_id=1)
        assert s.sample().workers == 0  # its first pass scans: nothing under it yet
        real, scans = psutil.Process.children, []
        monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: (
            scans.append(self.pid), real(self, recursive))[1])
        p.stdin.write("\n")
        p.stdin.flush()
        assert wait_for(lambda: real(psutil.Process(p.pid)), timeout=20, every=0.02)
        assert wait_for(lambda: s.sample().workers == 1, timeout=20, every=0.05)
        assert scans == [], scans
    finally:
        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait()
