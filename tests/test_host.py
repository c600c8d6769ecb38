"""Host sampling: a real process tree, a vanished process, a failing psutil field."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import psutil
import pytest

from monitor.host import HostSampler

TREE = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2)]
try:
    time.sleep(60)
finally:
    for k in kids: k.kill()
"""


@pytest.fixture
def tree():
    p = subprocess.Popen([sys.executable, "-c", TREE])
    deadline = time.monotonic() + 20
    while len(psutil.Process(p.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield p
    for c in psutil.Process(p.pid).children(recursive=True):
        c.kill()
    p.kill()
    p.wait()


def test_counts_workers_and_their_cpu(tree):
    s = HostSampler()
    s.watch(tree.pid, run_id=7)
    s.sample()
    time.sleep(1.0)
    rec = s.sample()
    assert rec.run_id == 7 and rec.workers == 2
    assert rec.workers_cpu_pct > 50  # two busy loops on two cores
    assert rec.workers_rss_mb > 1 and rec.proc_rss_mb > 1
    cores = json.loads(rec.cpu_per_core)
    assert len(cores) == psutil.cpu_count() and rec.mem_total_mb > rec.mem_used_mb > 0


def test_vanished_process_is_missing_not_an_error():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    s = HostSampler()
    s.watch(p.pid, run_id=1)
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
