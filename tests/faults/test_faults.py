"""The fault suite: each fault of the fault-injection pass, done for real (processes killed,
stores deleted, disks filled, datasets that hang), ending in a clear message, a true run
status and nothing left running. Every test ends with the no_leaks check and the store's
PRAGMA integrity_check."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from monitor.store import Store
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
BROKEN = ROOT / "tests" / "workloads" / "broken.py"
SCRIPTS = ROOT / "tests" / "scripts"
pytestmark = [pytest.mark.faults, pytest.mark.slow]
FAST = ["--preset", "healthy", "--batch-size", "8", "--step-time-ms", "10"]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "STARVATION_MONITOR_SIMULATE": "1", **extra}


def cli(*args: str, db: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "monitor", *args, "--db", str(db)],
                            cwd=ROOT, env=env(**kw), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def intact(db: Path) -> None:
    s = Store(db)
    assert s.integrity_ok()
    assert "running" not in set(s.runs()["status"]), s.runs()[["id", "status", "error"]]
    s.close()


def running_workload(store: Store, steps: int = 3) -> tuple[int, int]:
    """(run id, workload pid) once the newest run has recorded `steps` steps."""
    def ready():
        runs = store.runs()
        if runs.empty:
            return None
        run = int(runs["id"].iloc[0])
        pid = store.run(run)["pid"]
        return (run, int(pid)) if pid and len(store.steps(run)) >= steps else None
    found = wait_for(ready, timeout=90)
    assert found, "the workload never recorded steps"
    return found


@pytest.fixture
def tmpfs(tmp_path):
    """A small filesystem of our own (root in CI, as here); skipped where mount is refused."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def mount(size: str, *opts: str) -> Path:
        o = ",".join((f"size={size}", *opts))
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", o, "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        return mnt
    yield mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_killed_workload_fails_the_measurement(tmp_path, no_leaks):
    db = tmp_path / "m.db"
    p = cli("measure", *FAST, "--seconds", "20", "--json", db=db)
    run, pid = running_workload(Store(db))
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "workload process killed by signal 9 (SIGKILL)" in err and "dmesg" in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "failed"
    r = Store(db).run(run)
    assert r["status"] == "failed" and r["error"] == \
        "workload process killed by signal 9 (SIGKILL)"
    intact(db)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_hung_dataset_is_named_and_measure_ends(tmp_path, no_leaks, workers):
    """It hangs after its first batches, so at the deadline (2 s) the watchdog (its limit 4 s
    here, 10 s by default) has not spoken yet: measure waits for its verdict, then fails the
    run with it, instead of ending 'stopped, no data'."""
    db = tmp_path / "h.db"
    p = cli("measure", "--workload", f"{BROKEN}:hangs", "--num-workers", workers,
            "--step-time-ms", "10", "--seconds", "2", db=db, STARVATION_MONITOR_STALL_MIN_S="4")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert "the loader looks stuck" in err and "What to do" in err
    store = Store(db)
    run = store.run(int(store.runs()["id"].iloc[0]))
    assert run["status"] == "failed" and run["error"].startswith("no batch for")
    first = float(store.steps(int(run["id"]))["ts"].min())
    # the deadline holds: 2 s after the first batch, plus the watchdog's 4 s and its check
    assert run["ended_at"] - first < 2 + 4 + 4, run["ended_at"] - first
    where = ("inside the dataset at broken.py" if workers == "0"
             else "waiting for DataLoader workers")
    assert where in run["error"], run["error"]
    stalls = store.events(int(run["id"]), kinds=("stalled",))
    assert len(stalls) == 1
    intact(db)


class _Hangs:
    """A dataset whose every read hangs; each worker leaves a mark once it is inside one."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int):
        (self.marks / str(os.getpid())).touch()
        while True:
            time.sleep(3600)  # sleep-ok: the hang is the fault under test


def test_a_stuck_loaders_workers_are_terminated_not_waited_for(tmp_path, monkeypatch, no_leaks):
    """When the watchdog has found the loader stuck, closing it terminates its workers at
    once: torch's own shutdown first waits MP_STATUS_CHECK_INTERVAL for each worker to read
    the stop signal, which a worker asleep in __getitem__ never does (seen: measure took
    7 s to end a hung 2-worker run after failing it). The interval is made 30 s here, so a
    shutdown that waits on it cannot pass."""
    import torch.utils.data._utils as data_utils
    from torch.utils.data import DataLoader

    from workloads.runner import shutdown_iterator

    monkeypatch.setattr(data_utils, "MP_STATUS_CHECK_INTERVAL", 30.0)
    it = iter(DataLoader(_Hangs(tmp_path), batch_size=2, num_workers=2))
    workers = list(it._workers)
    assert wait_for(lambda: len(list(tmp_path.iterdir())) == 2, timeout=60), \
        "the workers never reached __getitem__"
    t = time.monotonic()
    shutdown_iterator(it, stuck=True)
    took = time.monotonic() - t
    assert not any(w.is_alive() for w in workers)
    assert took < 15, f"the shutdown waited {took:.1f} s for hung workers"


def test_no_first_batch_is_named_within_the_startup_allowance(tmp_path, no_leaks):
    """A dataset that hangs in its first __getitem__: no batch ever, no history; the start-up
    allowance (4 s here, 30 s by default) names it, and measure fails the run."""
    db = tmp_path / "f.db"
    p = cli("measure", "--workload", f"{BROKEN}:hangs_at_once", "--num-workers", "2",
            "--step-time-ms", "10", "--seconds", "2", db=db, STARVATION_MONITOR_STALL_MIN_S="2",
            STARVATION_MONITOR_STARTUP_S="4")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    store = Store(db)
    run = store.run(int(store.runs()["id"].iloc[0]))
    assert run["status"] == "failed", run
    assert run["error"].startswith("no first batch after"), run["error"]
    assert "waiting for DataLoader workers; workers " in run["error"]
    stall = store.events(int(run["id"]), kinds=("stalled",))
    assert json.loads(stall["data"].iloc[0])["limit_s"] == 4.0  # the allowance, not the floor
    assert store.steps(int(run["id"])).empty
    intact(db)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_attached_early_hang_is_named_and_the_run_fails_with_it(tmp_path, no_leaks, workers):
    """Under `monitor run`: a script whose loader hangs after two batches is named stuck on
    stderr within the floor; stopped by its user, the run is failed with what the watchdog
    said (the script itself is never stopped for being slow)."""
    db = tmp_path / "e.db"
    p = attached(db, "hangs_early.py", workers, STARVATION_MONITOR_STALL_MIN_S="3")
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(p.stderr.readline, "")),
                              daemon=True)
    reader.start()
    assert wait_for(lambda: any("looks stuck" in line for line in said), timeout=90), said
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)
    reader.join(10)
    line = next(x for x in said if "looks stuck" in x)
    where = "inside the dataset at hangs_early.py" if workers == "0" else \
        "waiting for DataLoader workers; workers "
    assert where in line, line
    run = Store(db).run(1)
    assert run["status"] == "failed" and run["error"].startswith("no batch for"), run
    assert "(then: interrupted (SIGINT)" in run["error"], run["error"]
    intact(db)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_hung_validation_loader_is_named_though_not_timed(tmp_path, no_leaks, workers):
    """NOTE [an untimed loader's stall]: a training epoch of 8 steps, then the validation
    loader (not timed: a later loader of a plain loop) hangs at its first batch. It is named
    stuck within its allowance, as that loader, with where the main process waits; stopped
    by its user, the run is failed with it, and the training's steps are kept. Before, the
    run read `stopped` with no stall named."""
    db = tmp_path / "v.db"
    p = attached(db, "hangs_early.py", workers, "validation", STARVATION_MONITOR_STALL_MIN_S="3")
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(p.stderr.readline, "")),
                              daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("looks stuck" in line for line in said), timeout=90), said
    finally:  # (named or not, its user stops it)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        reader.join(10)
    line = next(x for x in said if "looks stuck" in x)
    assert "DataLoader over HangsEarly, batch 8" in line and \
        "not timed (validation?): no first batch after" in line, line
    where = "inside the dataset at hangs_early.py" if workers == "0" else \
        "waiting for DataLoader workers; workers "
    assert where in line, line
    store = Store(db)
    stall = store.events(1, kinds=("stalled",))
    assert len(stall) == 1 and "HangsEarly" in stall["data"].iloc[0], stall
    run = store.run(1)
    assert run["status"] == "failed" and run["error"].startswith(
        "DataLoader over HangsEarly, batch 8"), run["error"]
    assert len(store.steps(1)) == 8  # the training epoch's, and nothing of the validation
    intact(db)


def test_a_validation_loaders_killed_worker_is_the_runs_reason(tmp_path, no_leaks):
    """NOTE [an untimed loader's stall]: the validation loader (not timed) has its worker
    killed at its first sample; torch's error reaches the script as it came, and the run's
    reason names that loader and the kill, not only the script's exit code."""
    db = tmp_path / "k.db"
    p = attached(db, "hangs_early.py", "2", "validation_killed")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "is killed by signal: Killed" in err, err[-2000:]
    store = Store(db)
    run = store.run(1)
    assert run["status"] == "failed", run
    assert "DataLoader over Dies, batch 8, 2 workers, not timed (validation?): RuntimeError: " \
           "DataLoader worker (pid(s)" in run["error"], run["error"]
    assert "killed by SIGKILL" in run["error"] and run["error"].endswith(
        "(then: the script ended with exit code 1)"), run["error"]
    # its own SIGKILL, not the OOM killer's: the kernel counted none (NOTE [who killed the
    # worker]), and the run says so and no memory advice
    assert "and not by the kernel's OOM killer, which killed nothing" in run["error"] and \
        "another process sent it" in run["error"], run["error"]
    assert "verdict: worker-killed" in err, err[-2000:]
    error = store.events(1, kinds=("loader error",))
    assert len(error) == 1 and "Dies" in json.loads(error["data"].iloc[0])["untimed"]
    assert len(store.steps(1)) == 8
    intact(db)


def test_the_page_says_it_waits_for_the_first_batch(store):
    import pandas as pd

    from monitor.ui.view import first_batch_wait

    run = store.create_run("r", "managed", {})
    row = store.run(run)
    now = float(row["started_at"]) + 12.0
    steps, host = store.steps(run), store.host_samples(0.0)
    assert first_batch_wait(row, steps, host, now) == "waiting for the first batch: 12 s"
    sampled = pd.DataFrame({"ts": [now - 12.0, now - 11.0], "workers": [0, 2]})
    assert first_batch_wait(row, steps, sampled, now) == \
        "waiting for the first batch: 12 s; 2 workers started 11 s ago"


def test_store_deleted_during_measure(tmp_path, no_leaks):
    db = tmp_path / "d.db"
    p = cli("measure", *FAST, "--seconds", "6", "--json", db=db)
    running_workload(Store(db))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert f"the store {db} was deleted or replaced while recording" in err
    assert "Traceback" not in err and not out.strip()  # no figures from a lost store


def test_full_disk_fails_the_run_and_start_up_closes_it(tmpfs, no_leaks):
    mnt = tmpfs("300k")
    db = mnt / "full.db"
    p = cli("measure", *FAST, "--seconds", "30", db=db)
    _, err = p.communicate(timeout=90)
    assert p.returncode == 1, err
    assert f"the disk holding the store {db} is full" in err and "Traceback" not in err
    subprocess.run(["mount", "-o", "remount,size=20m", str(mnt)], check=True)
    from monitor.manage.runtime import Runtime

    # Where even the run's end could not be written, the next start-up closes it, with the
    # reason the process knew (kept beside the store, in blocks it reserved at the start)
    with Runtime(db) as rt:
        closed = rt.orphans_closed
    run = Store(db).run(1)
    assert run["status"] == "failed"
    if closed:
        assert closed == [1] and run["error"].startswith("the store could not be written: "
                                                         f"the disk holding the store {db} "
                                                         "is full"), run["error"]
    else:
        assert "is full" in run["error"]
    print(f"closed at start-up: {closed}: {run['error']}")
    assert Store(db).notes.read() == {}  # taken once
    intact(db)


@pytest.mark.parametrize("case", ["proc", "not-sqlite", "ro-new", "ro-existing"])
def test_paths_that_cannot_be_a_store(tmp_path, tmpfs, case):
    if case == "proc":
        db = Path("/proc/starvation-monitor/m.db")
    elif case == "not-sqlite":
        db = tmp_path / "notes.db"
        db.write_text("my notes\n")
    else:
        mnt = tmpfs("1m")
        if case == "ro-existing":
            Store(mnt / "m.db").close()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        db = mnt / ("new.db" if case == "ro-new" else "m.db")
    before = sorted(p.name for p in db.parent.iterdir()) if db.parent.exists() else None
    p = cli("measure", "--seconds", "1", db=db)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(db) in lines[0], err
    assert "--db" in lines[0]  # says what to do
    after = sorted(p.name for p in db.parent.iterdir()) if db.parent.exists() else None
    assert after == before  # nothing created


def test_bad_arguments_create_nothing(tmp_path):
    db = tmp_path / "sub" / "m.db"
    p = cli("measure", "--seconds", "-5", db=db)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--seconds must be positive" in err
    assert not db.parent.exists()


def attached_and_training(db: Path) -> tuple[subprocess.Popen, Store]:
    """`monitor run` over two_epochs.py (a long pause between epochs), once it trains."""
    p = attached(db, "two_epochs.py", "0", "60")
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    assert wait_for(lambda: len(store.steps(1)) >= 12, timeout=90)
    return p, store


def test_sigint_to_monitor_run_reaches_the_script_and_stops_the_run(tmp_path, no_leaks):
    """A scheduler or a script stopping the wrapper with SIGINT (no terminal involved)."""
    db = tmp_path / "a.db"
    p, store = attached_and_training(db)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err  # the script's own status: killed by SIGINT
    assert "KeyboardInterrupt" in err  # the script got it (its traceback passes through)
    run = store.run(1)
    assert run["status"] == "stopped" and "interrupted (SIGINT)" in run["error"]
    intact(db)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_are_forwarded_too(tmp_path, no_leaks, sig):
    db = tmp_path / "a.db"
    p, store = attached_and_training(db)
    p.send_signal(sig)
    p.communicate(timeout=60)
    assert p.returncode == 128 + sig
    assert store.run(1)["status"] == "stopped"
    intact(db)


def test_superseded_requests_are_marked(store, no_leaks):
    from monitor.config import LoaderConfig
    from monitor.manage.session import SessionManager

    cfg = LoaderConfig.build(preset="healthy", batch_size=8, step_time_ms=10.0)
    m = SessionManager(store, cfg)
    try:
        run = m.start()
        assert m.wait_for_steps(3, timeout=90)
        ids = []
        for i in range(25):  # a user dragging the slider for 5 s
            ids.append(m.reconfigure(cfg.replace(num_workers=1 + i % 3)))
            time.sleep(0.2)  # sleep-ok: the user's pace is the scenario
        last = cfg.replace(num_workers=1 + 24 % 3)
        assert wait_for(lambda: store.control_result(ids[-1])[1] == "ok", timeout=60)
        results = [store.control_result(i)[1] for i in ids if i is not None]
        assert all(r is not None for r in results), results
        assert set(results) <= {"ok"} | {r for r in results if r.startswith("superseded")}
        assert store.run(run)["config"]["num_workers"] == last.num_workers
    finally:
        m.close()
    assert all(store.control_result(i)[0] for i in ids if i is not None)
    assert store.integrity_ok()


def test_interrupted_managed_and_attached_runs_are_both_stopped(tmp_path, no_leaks):
    db = tmp_path / "i.db"
    p = cli("measure", *FAST, "--seconds", "30", db=db)
    running_workload(Store(db))
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert Store(db).runs()["status"].tolist() == ["stopped"]
    intact(db)


def attached(db: Path, script: str, *args: str, **kw: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "monitor", "run", "--db", str(db), "--",
                             sys.executable, str(SCRIPTS / script), *args], cwd=ROOT,
                            env=env(**kw), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_attached_stall_is_said_and_the_training_goes_on(tmp_path, no_leaks):
    db = tmp_path / "s.db"
    p = attached(db, "stalls_once.py", "5", STARVATION_MONITOR_STALL_MIN_S="2")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "done: 64 samples" in out, err
    assert err.count("the loader looks stuck") == 1
    assert "inside the dataset at stalls_once.py" in err
    store = Store(db)
    assert store.events(1, kinds=("stalled", "resumed"))["kind"].tolist() == [
        "stalled", "resumed"]
    assert store.run(1)["status"] == "finished"
    intact(db)


def test_attached_store_deleted_recording_stops_training_goes_on(tmp_path, no_leaks):
    db = tmp_path / "a.db"
    p = attached(db, "two_epochs.py", "0", "3")
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    assert wait_for(lambda: len(store.steps(1)) >= 12, timeout=90)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "epoch 1 done: 96 samples" in out  # the training went on
    assert err.count("recording stopped") == 1 and "was deleted or replaced" in err


def test_a_move_whose_worker_is_killed_goes_back_and_the_run_goes_on(no_leaks, runtime):
    """The page's managed workload, moved from 0 to 2 workers by the autotuner; one of the
    new workers is SIGKILLed mid-epoch: the loader goes back to the last good settings (0
    workers), the move's request is marked failed with the reason, the run keeps training,
    and the session manager (so the page's sliders) follows."""
    import psutil

    from monitor import control
    from monitor.config import LoaderConfig

    store, manager = runtime.store, runtime.manager
    run = manager.start(LoaderConfig.build(preset="starving", batch_size=8,
                                           step_time_ms=10.0))
    assert wait_for(lambda: len(store.steps(run)) >= 30, timeout=90)  # 0 workers: proven
    cid = manager.reconfigure(manager.config.replace(num_workers=2),
                              source="autotune: a loader per usable core")
    workload = psutil.Process(store.run(run)["pid"])

    def workers() -> list:
        if (store.run(run)["config"] or {}).get("num_workers") != 2:
            return []
        kids = [k for k in workload.children() if k.is_running()]
        return kids if len(kids) >= 2 and len(store.steps(run, since=time.time() - 1)) else []
    kids = wait_for(workers, timeout=60)
    assert kids, "the move never ran with its workers"
    kids[0].send_signal(signal.SIGKILL)
    def back() -> bool:
        return (store.run(run)["config"] or {}).get("num_workers") == 0
    assert wait_for(back, timeout=60), store.events(run)[["kind", "label"]]
    seq = int(store.steps(run)["config_seq"].max())
    assert wait_for(lambda: len(store.steps(run, since=time.time() - 1.0)) >= 5 and
                    int(store.steps(run)["config_seq"].max()) >= seq, timeout=60)
    r = store.run(run)
    assert r["status"] == "running" and manager.is_alive()
    failed = [e for e in store.events(run, kinds=(control.CONFIG,)).itertuples()
              if "the move failed" in e.label]
    assert len(failed) == 1 and "num_workers 2→0" in failed[0].label, failed
    assert "DataLoader worker" in failed[0].label  # torch's own words, as the reason
    _, result = store.control_result(cid)
    assert control.is_refused(result) and "the move failed" in result, result
    assert wait_for(lambda: manager.config.num_workers == 0, timeout=10)
    manager.stop()
    assert store.run(run)["status"] == "stopped"
