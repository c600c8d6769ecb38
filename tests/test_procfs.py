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


def fake_proc(tmp_path, pid=42, threads=((100, 7), (50, 3)),
              io="rchar: 9000000\nwchar: 1\nread_bytes: 4096\n"):
    for i, (run, wait) in enumerate(threads):
        d = tmp_path / str(pid) / "task" / str(pid + i)
        d.mkdir(parents=True)
        (d / "schedstat").write_text(f"{run} {wait} 9\n")
    if io is not None:
        (tmp_path / str(pid) / "io").write_text(io)
    return str(tmp_path)


def test_schedstat_sums_the_threads_and_io_reads_the_block_devices_bytes(tmp_path):
    root = fake_proc(tmp_path)
    t = procfs.schedstat(42, root)
    assert (t.on_cpu_ns, t.runq_ns) == (150, 10)
    assert procfs.storage_reads(42, root) == 4096  # read_bytes, not rchar


def test_a_pass_reads_each_stat_once_and_a_reused_pid_is_not_the_process(tmp_path):
    """StatPass stands for psutil's is_running, cpu_times, num_threads, status and
    memory_info's rss: the fields of one raw read; the same PID with a later start (another
    process) is not running for the object that read it first, and is for one made since."""
    import types

    def stat(state: str, utime: int, stime: int, start: int) -> None:
        fields = [state, "1", *["0"] * 9, str(utime), str(stime), str(2 * procfs.TICK),
                  str(procfs.TICK), "20", "0", "3", "0", str(start), "0", "100"]
        (tmp_path / "42").mkdir(exist_ok=True)
        (tmp_path / "42" / "stat").write_text(f"42 (pt_data_worker) {' '.join(fields)}\n")

    stat("D", 3 * procfs.TICK, procfs.TICK, 5000)
    sp, worker = procfs.StatPass(str(tmp_path)), types.SimpleNamespace(pid=42)
    assert sp.running(worker)
    assert sp.cpu_s(42) == 4.0 and sp.status(42) == "disk-sleep"  # psutil's name
    st = sp.now(42)
    assert (st.threads, st.children_cpu_s, st.rss) == (3, 3.0, 100 * procfs.PAGE)
    sp.end_pass({42})
    assert sp.cpu_s(42) is None  # a pass's reads are that pass's
    stat("S", 3 * procfs.TICK, procfs.TICK, 9000)  # PID 42 taken by another process
    assert not sp.running(worker)
    assert sp.running(types.SimpleNamespace(pid=42))  # an object made for the new one
    os.remove(tmp_path / "42" / "stat")
    assert not sp.running(worker) and sp.status(43) is None  # gone; never seen
    # a live process: the same figures as psutil's
    import psutil

    me, live = psutil.Process(), procfs.StatPass()
    assert live.running(me) and live.status(me.pid) == me.status()
    assert abs(live.cpu_s(me.pid) - sum(me.cpu_times()[:2])) <= 0.05
    st, times = live.now(me.pid), me.cpu_times()
    assert abs(st.children_cpu_s - times.children_user - times.children_system) <= 0.05
    assert abs(st.rss - me.memory_info().rss) <= 4 * 2**20 and st.threads == me.num_threads()


def test_run_queue_time_since_a_read_never_goes_back_when_a_thread_ends():
    """A thread that ended between two reads takes its time out of the process's sum; the
    time since is taken thread by thread (a Ray rank read negative before)."""
    before = procfs.SchedTimes(0, 0, (("1", 100, 70), ("2", 50, 30)))
    after = procfs.SchedTimes(0, 0, (("1", 120, 75), ("3", 10, 4)))  # 2 ended, 3 was born
    assert after.runq_since(before) == 5 + 4


def test_reads_from_the_page_cache_are_not_storage_reads(tmp_path):
    """This process reads a file 200 times: from the page cache it is no storage read;
    dropped from the cache first (as a cold file on a disk is), every read is one."""
    if procfs.storage_reads(os.getpid()) is None:
        pytest.skip("no /proc/<pid>/io here")
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(64 * 4096))
    os.sync()

    def read_all(drop: bool) -> int:
        before = procfs.storage_reads(os.getpid())
        for i in range(200):
            fd = os.open(f, os.O_RDONLY)
            try:
                if drop:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.pread(fd, 4096, (i % 64) * 4096)
            finally:
                os.close(fd)
        return procfs.storage_reads(os.getpid()) - before

    read_all(False)  # in the cache now
    cached, cold = read_all(False), read_all(True)
    assert cached < 200 * 4096 * 0.1, cached
    assert cold >= 200 * 4096 * 0.9, cold


def test_missing_files_are_none_not_errors(tmp_path):
    root = fake_proc(tmp_path, io=None)
    assert procfs.storage_reads(42, root) is None
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
