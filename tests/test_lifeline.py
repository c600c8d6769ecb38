"""Nothing outlives its launcher (NOTE [bound to monitor run] in monitor/probe/lifeline.py):
a SIGKILL of `monitor run`'s process group, as a harness, a scheduler or `timeout -s KILL`
sends it, ends the script and its DataLoader workers, and the run is stored as ended, not
left `running`; a script killed alone takes its workers with it within the second, not at
torch's own check of its parent (every 5 s)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from monitor.store import FAILED, Store
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.faults]


def _launch(db: Path) -> subprocess.Popen:
    """`monitor run` over a steady 2-worker loop, as the leader of a process group of its
    own (what a harness that kills "the job's group" holds)."""
    return subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--", sys.executable,
         str(ROOT / "tests" / "scripts" / "steady_loop.py"), "120"],
        cwd=ROOT, env={**os.environ, "STEADY_WORKERS": "2"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _script_and_workers(launcher: subprocess.Popen) -> list[psutil.Process]:
    """The script and its two workers, once they run (the script is monitor run's child)."""
    def found() -> list[psutil.Process] | None:
        try:
            kids = psutil.Process(launcher.pid).children()
        except psutil.NoSuchProcess:
            return None
        scripts = [k for k in kids if "steady_loop.py" in " ".join(k.cmdline())]
        if not scripts:
            return None
        workers = scripts[0].children()
        return [scripts[0], *workers] if len(workers) == 2 else None
    procs = wait_for(found, timeout=90)
    assert procs, "the script never started its two workers"
    return procs


def _gone_within(procs: list[psutil.Process], timeout: float) -> float | None:
    """Seconds until every process in `procs` ended (zombies count as ended), else None."""
    t0 = time.monotonic()
    alive = procs
    while time.monotonic() - t0 < timeout:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return time.monotonic() - t0
        time.sleep(0.01)  # sleep-ok: a poll's interval, under a deadline
    return None


def test_killing_the_launchers_group_ends_the_script_and_its_workers(tmp_path):
    db = tmp_path / "monitor.db"
    launcher = _launch(db)
    procs = _script_and_workers(launcher)
    try:
        os.killpg(launcher.pid, signal.SIGKILL)  # the group: monitor run alone is in it
        launcher.wait(30)
        took = _gone_within(procs, timeout=20)
        assert took is not None, [p.pid for p in procs if p.is_running()]
        print(f"script and workers gone {took:.3f} s after the group's SIGKILL")
    finally:
        for p in procs:
            if p.is_running():
                p.kill()
    # the script's probe ended the run before it ended its group (NOTE [bound to monitor
    # run], 4); a script killed before its probe recorded is ended by the next open
    store = Store(db)
    assert wait_for(lambda: store.run(1)["status"] != "running" or store.close_orphans(),
                    timeout=30)
    run = store.run(1)
    assert run["status"] == FAILED and "killed" in run["error"], run


def test_a_script_killed_alone_takes_its_workers_at_once(tmp_path):
    db = tmp_path / "monitor.db"
    launcher = _launch(db)
    procs = _script_and_workers(launcher)
    try:
        procs[0].kill()
        took = _gone_within(procs[1:], timeout=20)
        # bound workers get their SIGKILL as the kernel ends the script (0.01 s here, quiet
        # or busy); unbound, torch's own check of the parent took seconds
        assert took is not None, "the killed script's workers outlived it"
        print(f"workers gone {took:.3f} s after the script's SIGKILL")
        assert took < 2.0, f"the workers took {took:.1f} s to follow the killed script"
        assert launcher.wait(60) == 128 + signal.SIGKILL  # the script's status, as bare
    finally:
        for p in procs:
            if p.is_running():
                p.kill()
        if launcher.poll() is None:
            launcher.kill()
    run = Store(db).run(1)
    assert run["status"] == FAILED and "SIGKILL" in run["error"], run
