"""The /proc readers behind the measured time split: schedstat and io against fixture files,
then against live processes (a busy loop is on a CPU, a sleeper is blocked), and the host
sampler's run-queue and reaped-worker figures on a real process tree."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from monitor.sampling import procfs
from monitor.sampling.host import HostSampler
from tests.conftest import wait_for


def fake_proc(tmp_path, pid=42, threads=((100, 7), (50, 3)), io="rchar: 4096\nwchar: 1\n"):
    for i, (run, wait) in enumerate(threads):
        d = tmp_path / str(pid) / "task" / str(pid + i)
        d.mkdir(parents=True)
        (d / "schedstat").write_text(f"{run} {wait} 9\n")
    if io is not None:
        (tmp_path / str(pid) / "io").write_text(io)
    return str(tmp_path)


def test_schedstat_sums_the_threads_and_io_reads_rchar(tmp_path):
    root = fake_proc(tmp_path)
    assert procfs.schedstat(42, root) == procfs.SchedTimes(150, 10)
    assert procfs.read_chars(42, root) == 4096


def test_missing_files_are_none_not_errors(tmp_path):
    root = fake_proc(tmp_path, io=None)
    assert procfs.read_chars(42, root) is None
    assert procfs.schedstat(7, root) is None  # no such process
    (tmp_path / "42" / "task" / "42" / "schedstat").write_text("garbage\n")
    (tmp_path / "42" / "task" / "43" / "schedstat").write_text("")
    assert procfs.schedstat(42, root) is None


def test_live_processes_busy_and_sleeping():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    nap = "import time; print('up', flush=True); time.sleep(30)"  # sleep-ok: the sleeper
    sleeper = subprocess.Popen([sys.executable, "-c", nap], stdout=subprocess.PIPE, text=True)
    try:
        # measured once it sleeps: its interpreter's start-up is CPU (62 ms of it was seen
        # inside the window on a loaded box)
        assert sleeper.stdout.readline().strip() == "up"
        a = {p.pid: procfs.schedstat(p.pid) for p in (busy, sleeper)}
        time.sleep(0.6)  # sleep-ok: the interval the processes are measured over
        b = {p.pid: procfs.schedstat(p.pid) for p in (busy, sleeper)}
        ran = {pid: (b[pid].on_cpu_ns - a[pid].on_cpu_ns + b[pid].runq_ns - a[pid].runq_ns)
               / 1e9 for pid in a}
        # the busy loop is on a CPU or waiting for one all the time; the sleeper neither
        assert ran[busy.pid] > 0.4 and ran[sleeper.pid] < 0.05, ran
    finally:
        for p in (busy, sleeper):
            p.kill()
            p.wait()


TREE = """
import subprocess, sys, time
kid = subprocess.Popen([sys.executable, '-c', 'x = 0\\nfor i in range(3 * 10**7): x += i'])
print(kid.pid, flush=True)
kid.wait()
time.sleep(30)  # sleep-ok: the parent lingers while the test samples it
"""


def test_sampler_counts_a_reaped_workers_cpu_and_the_run_queue(no_leaks):
    """A child that burns ~1 s of CPU and exits between two samples: its CPU shows in the
    reaped column, from the parent's children times."""
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        kid = int(p.stdout.readline())
        s = HostSampler()
        s.follow(p.pid, run_id=1)
        first = s.sample()
        assert wait_for(lambda: _children_cpu(p.pid) > 0.3, timeout=60)  # reaped
        assert not os.path.exists(f"/proc/{kid}")
        second = s.sample()
        assert first.workers_reaped_cpu_pct is None  # nothing to compare with yet
        assert second.workers_reaped_cpu_pct is not None and second.workers_reaped_cpu_pct > 0
        assert second.proc_runq_pct is not None and second.proc_runq_pct >= 0
    finally:
        p.kill()
        p.wait()


def _children_cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.children_user + t.children_system


@pytest.mark.parametrize("key", ["schedstat", "io"])
def test_this_machine_has_the_readers(key):
    assert procfs.available()[key]
