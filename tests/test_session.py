"""Managed workload processes, end to end on the simulated accelerator: live reconfiguration,
stop, and failure scenarios. Each test checks that no process and no /dev/shm segment is left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from monitor.config import LoaderConfig
from monitor.manage.session import SessionManager
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

FAST = LoaderConfig.build(preset="healthy", batch_size=8, step_time_ms=5.0)


@pytest.fixture
def manager(store, no_leaks):
    m = SessionManager(store, FAST, stop_timeout=10.0)
    yield m
    m.close()


def test_reconfigure_reaches_running_workload_within_2s(manager, store):
    run = manager.start()
    assert manager.wait_for_steps(5, timeout=90), store.run(run)
    new = FAST.replace(num_workers=2)
    t_req = time.time()
    cid = manager.reconfigure(new)
    assert cid is not None
    applied = wait_for(lambda: store.control_result(cid)[0], timeout=30)
    assert applied and store.control_result(cid)[1] == "ok"
    assert applied - t_req < 2.0, f"applied after {applied - t_req:.2f} s"
    ev = store.events(run)
    assert "num_workers 0→2" in ev["label"].iloc[-1]
    # steps keep coming with the new generation, from the worker processes
    assert wait_for(lambda: (store.steps(run)["config_seq"] == 1).sum() >= 5, timeout=60)
    kids = psutil.Process(manager.pid).children(recursive=True)
    assert len(kids) >= 2
    manager.stop()
    assert store.run(run)["status"] == "stopped"
    assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)


def test_accelerator_only_change_keeps_the_loader(manager, store):
    run = manager.start()
    assert manager.wait_for_steps(3, timeout=90)
    cid = manager.reconfigure(FAST.replace(step_time_ms=20.0))
    assert wait_for(lambda: store.control_result(cid)[1] == "ok", timeout=30)
    assert "step_time_ms 5→20" in store.events(run)["label"].iloc[-1]
    assert wait_for(lambda: (store.steps(run)["config_seq"] == 1).sum() >= 3, timeout=30)
    steps = store.steps(run)
    before, after = steps[steps["config_seq"] == 0], steps[steps["config_seq"] == 1]
    # the same iterator goes on: no new epoch at the change (1024 steps per epoch here)
    assert after["epoch"].iloc[0] == before["epoch"].iloc[-1]
    # the step 15 ms longer (a busy box lengthens both sleeps alike: under a loaded suite the
    # 5 ms steps' median once read over 15 ms)
    assert after["compute_s"].median() - before["compute_s"].median() > 0.010, (
        before["compute_s"].median(), after["compute_s"].median())


def test_dataset_exception_in_worker_fails_the_run_with_its_text(store, no_leaks, monkeypatch):
    monkeypatch.setenv("STARVATION_MONITOR_FAULT_AT", "5")
    m = SessionManager(store, FAST.replace(num_workers=2))
    try:
        run = m.start()
        assert wait_for(lambda: store.run(run)["status"] == "failed", timeout=90)
        err = store.run(run)["error"]
        assert "injected fault at sample 5" in err and "worker" in err.lower()
        assert wait_for(lambda: not m.is_alive(), timeout=10)
    finally:
        m.close()


def test_dataset_exception_in_main_process(store, no_leaks, monkeypatch):
    monkeypatch.setenv("STARVATION_MONITOR_FAULT_AT", "3")
    cfg = LoaderConfig.build(preset="healthy", batch_size=8, step_time_ms=5.0)
    m = SessionManager(store, cfg)
    try:
        run = m.start()
        assert wait_for(lambda: store.run(run)["status"] == "failed", timeout=90)
        assert store.run(run)["error"].startswith("RuntimeError: injected fault at sample 3")
    finally:
        m.close()


def test_killed_worker_fails_the_run(manager, store):
    run = manager.start(FAST.replace(num_workers=2))
    assert manager.wait_for_steps(5, timeout=90)
    worker = psutil.Process(manager.pid).children()[0]
    worker.send_signal(signal.SIGKILL)
    assert wait_for(lambda: store.run(run)["status"] == "failed", timeout=60)
    assert "worker" in store.run(run)["error"].lower()


def test_killed_workload_is_reaped_with_its_workers(manager, store):
    run = manager.start(FAST.replace(num_workers=2))
    assert manager.wait_for_steps(5, timeout=90)
    workers = psutil.Process(manager.pid).children(recursive=True)
    # the reaper has remembered the workers (it snapshots every 0.5 s)
    assert wait_for(lambda: {w.pid for w in workers} <= set(manager._children), timeout=15)
    os.kill(manager.pid, signal.SIGKILL)
    assert wait_for(lambda: store.run(run)["status"] == "failed", timeout=30)
    assert "signal 9" in store.run(run)["error"]
    assert wait_for(lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE
                                      for w in workers), timeout=15)


def test_preset_switch_stops_old_run_and_starts_new(manager, store):
    first = manager.start()
    assert manager.wait_for_steps(2, timeout=90)
    second = manager.reconfigure(FAST.replace(preset="io-bound"))
    assert second != first and manager.run_id == second
    assert store.run(first)["status"] == "stopped"
    assert manager.wait_for_steps(2, timeout=90)
    assert store.run(second)["config"]["preset"] == "io-bound"


def test_workload_stops_itself_when_its_parent_dies(store, db_path, no_leaks):
    code = f"""
import sys, time
sys.path.insert(0, {str(db_path.parent.parent)!r})
from monitor.config import LoaderConfig
from monitor.manage.session import SessionManager
from monitor.store import Store
sys.path.insert(0, {os.getcwd()!r})
m = SessionManager(Store({str(db_path)!r}),
                   LoaderConfig.build(preset='healthy', batch_size=8, step_time_ms=5.0,
                                      num_workers=1))
print(m.start(), m.pid, flush=True)
time.sleep(120)  # sleep-ok: the parent lives until the test kills it
"""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=os.getcwd())
    run, pid = (int(x) for x in parent.stdout.readline().split())
    assert wait_for(lambda: len(store.steps(run)) >= 3, timeout=90)
    workload = psutil.Process(pid)
    parent.kill()
    parent.wait()
    assert wait_for(lambda: store.run(run)["status"] != "running", timeout=30)
    assert store.run(run)["status"] == "stopped"
    assert "exited" in (store.run(run)["error"] or "")
    assert wait_for(lambda: not workload.is_running() or
                      workload.status() == psutil.STATUS_ZOMBIE, timeout=15)


def test_calibrated_preset_meets_the_same_device_in_later_runs(store, no_leaks):
    m = SessionManager(store, LoaderConfig.build(preset="starving", batch_size=8))
    try:
        first = m.start()
        assert m.wait_for_steps(2, timeout=90)
        second = m.start(LoaderConfig.build(preset="starving", batch_size=8, num_workers=1))
        assert m.wait_for_steps(2, timeout=90)
        a, b = store.run(first)["accelerator"], store.run(second)["accelerator"]
        assert "holds the device for" in a and a == b
        assert store.calibration("sample_cost_s:starving") is not None
    finally:
        m.close()


def test_later_workloads_are_forked_from_one_server_and_its_death_falls_back(manager, store):
    """The first workload is spawned (a manager that runs one never starts the server); each
    later one is forked by the manager's fork server (torch imported once): its parent is
    the server, it runs and is reaped with its real exit status. A server that died leaves
    the next start to a fresh interpreter, as before."""
    first = manager.start()
    assert manager.wait_for_steps(3, timeout=90)
    assert psutil.Process(manager.pid).parent().pid == os.getpid()
    t0 = time.monotonic()
    manager.start()
    assert manager.wait_for_steps(3, timeout=90)
    print(f"second workload's first 3 steps {time.monotonic() - t0:.2f} s after its start")
    assert store.run(first)["status"] == "stopped"
    server = psutil.Process(manager.pid).parent()
    assert "workloads.forkserver" in " ".join(server.cmdline())
    assert server.parent().pid == os.getpid()
    t0 = time.monotonic()
    third = manager.start()
    assert manager.wait_for_steps(3, timeout=90)
    print(f"third workload's first 3 steps {time.monotonic() - t0:.2f} s after its start")
    assert psutil.Process(manager.pid).parent().pid == server.pid
    psutil.Process(manager.pid).send_signal(signal.SIGKILL)
    assert wait_for(lambda: store.run(third)["status"] == "failed", timeout=30)
    assert "killed by signal 9 (SIGKILL)" in store.run(third)["error"]
    server.kill()
    server.wait(10)
    fourth = manager.start()
    assert manager.wait_for_steps(3, timeout=90), store.run(fourth)
    assert psutil.Process(manager.pid).parent().pid == os.getpid()  # spawned by us
    assert "workloads.runner" in " ".join(psutil.Process(manager.pid).cmdline())
