"""Starts, reconfigures and stops workload processes, and reaps them.

One SessionManager per dashboard process (st.cache_resource) or CLI command. Workloads run
in fresh interpreters, as multiprocessing's "spawn" starts them (fork is unsafe beside
Streamlit's threads and a CUDA context), but launched with subprocess: Streamlit swaps
sys.modules["__main__"] for the page script while it runs, and multiprocessing's spawn would
re-import that page in the child and start a workload from inside the workload. How a
workload ends is described once, in monitor/manage/runtime.py (NOTE [shutdown protocol]); this
module holds the manager's half of it (points 1, 3 and 5).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from monitor import control
from monitor.assess.same_runs import managed_identity
from monitor.config import ConfigError, LoaderConfig
from monitor.manage import spawn
from monitor.periodic import Periodic
from monitor.probe.workers import remove_dead_segments
from monitor.records import EPOCH, SHM
from monitor.store import FAILED, MANAGED, STOPPED, Store, explain


def workload_args(store_path: str, run_id: int, config: dict[str, Any],
                  parent_pid: int | None = None) -> list[str]:
    """The workload's arguments to `python -m workloads.runner` (the dashboard process
    itself never imports torch); `parent_pid`: the process that starts it (we, or the fork
    server)."""
    return ["--db", store_path, "--run-id", str(run_id), "--config", json.dumps(config),
            "--parent-pid", str(parent_pid or os.getpid())]


def _kill_tree(procs: list[psutil.Process], timeout: float = 3.0) -> None:
    """Terminate, then kill, every process in `procs` that is still alive."""
    alive = []
    for p in procs:
        try:
            p.terminate()
            alive.append(p)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)


def exit_text(code: int) -> str:
    """'workload process killed by signal 9 (SIGKILL)' or '... exited with code 1'."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"workload process killed by signal {-code} ({name})"
    return f"workload process exited with code {code}"


def _wait(proc: subprocess.Popen | spawn.Forked, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


def remove_left_segments(store: Store, run_id: int, pid: int,
                         seen: set[int] | None = None) -> list[str]:
    """The /dev/shm segments the ended job's processes (the script and every epoch's
    workers, and any other descendant `seen`) left behind, removed: a process killed
    between torch's making a segment and its unlinking (the kernel's OOM killer; a stop's
    SIGKILL on a busy box) leaves one holding memory for good."""
    pids = {pid, *(seen or ())}
    for raw in store.events(run_id, kinds=(EPOCH,))["data"]:
        pids.update((json.loads(raw or "{}") or {}).get("worker_pids") or [])
    return remove_dead_segments(pids)


class SessionManager:
    """Owns at most one workload process at a time. Thread-safe."""

    def __init__(
        self,
        store: Store,
        config: LoaderConfig | None = None,
        stop_timeout: float = 5.0,
        reap_interval: float = 0.5,
        on_start: Any = None,
    ) -> None:
        self.store = store
        self.config = config or LoaderConfig()
        self.stop_timeout = stop_timeout
        self.on_start = on_start  # callback(pid, run_id), e.g. Collector.watch
        self.run_id: int | None = None
        self.started_once = False
        self.last_error: str | None = None
        self._proc: subprocess.Popen | spawn.Forked | None = None
        self._children: dict[int, psutil.Process] = {}
        # later workloads are forked from a server that imported torch once
        # (spawn.ForkServer); STARVATION_MONITOR_FORKSERVER=0 spawns each in a fresh
        # interpreter instead
        self._forks = spawn.ForkServer() \
            if os.environ.get("STARVATION_MONITOR_FORKSERVER", "1") != "0" else None
        self._lock = threading.RLock()
        self._reaper = Periodic("starvation-reaper", self._reap, reap_interval).start()
        atexit.register(self.close)

    # -- commands ----------------------------------------------------------------------
    def start(self, config: LoaderConfig | None = None, name: str | None = None) -> int:
        """Stop any running workload and start a new run with `config`."""
        with self._lock:
            self.stop()
            cfg = config or self.config
            self.config = cfg
            run_id = self.store.create_run(name or f"{cfg.preset}", MANAGED, cfg.to_dict())
            proc = self._spawn(run_id, cfg)
            self._proc, self.run_id, self.started_once = proc, run_id, True
            self._children = {}
            self.store.update_run(run_id, pid=proc.pid,
                                  identity=managed_identity(cfg.to_dict()))
            if self.on_start is not None:
                self.on_start(proc.pid, run_id)
            return run_id

    def _spawn(self, run_id: int, cfg: LoaderConfig) -> subprocess.Popen | spawn.Forked:
        """The workload process: forked by the fork server from the second run on (or from
        the first after `warm()`), else spawned. A manager that runs one workload (`monitor
        measure`, a page opened once) never starts the server, and the first start never
        waits for it."""
        path, config = str(self.store.path), cfg.to_dict()
        server = self._forks.ensure() \
            if self._forks is not None and (self.started_once or self._forks.pid) else None
        if server is not None:
            proc = self._forks.start(workload_args(path, run_id, config, server))
            if proc is not None:
                return proc
        return spawn.start("workloads.runner", *workload_args(path, run_id, config))

    def warm(self) -> bool:
        """Start the fork server now rather than at the first workload (a caller about to run
        several: a sweep, a test module); True when it is up."""
        return self._forks is not None and self._forks.ensure() is not None

    def ensure_started(self) -> int | None:
        """Start the default run once per manager (the page's first open); a user who
        pressed Stop is not overruled by a reload."""
        with self._lock:
            if self.started_once:
                return None
            return self.start()

    def reconfigure(self, config: LoaderConfig, source: str | None = None) -> int | None:
        """Apply new settings to the running workload (within about a step and 0.25 s).

        A preset change starts a new run; returns the control request id, or the new run id
        for a restart (None when nothing runs: the settings are kept for the next start).
        `source` ("autotune: why") labels the change's marker.
        """
        if not isinstance(config, LoaderConfig):
            raise ConfigError("reconfigure needs a LoaderConfig")
        with self._lock:
            old = self.config
            self.config = config
            if not self.is_alive():
                return None
            if config.preset != old.preset:
                return self.start(config)
            if config == old:
                return None
            return self.store.request_control(
                self.run_id, control.CONFIG, control.config_payload(config.to_dict(), source))

    def stop(self, timeout: float | None = None, stuck: bool = False) -> None:
        """Ask the workload to stop; terminate, then kill, it and its children if it does not
        (NOTE [shutdown protocol] in monitor/manage/runtime.py, 1 and 3). `stuck`: its loop
        is known stuck (the watchdog said so) and cannot read a request: terminate at once."""
        with self._lock:
            proc, run_id = self._proc, self.run_id
            if proc is None or run_id is None:
                return
            timeout = self.stop_timeout if timeout is None else timeout
            self._snapshot_children()
            if proc.poll() is not None:  # it ended before we asked: not a stop
                self._finish_dead(proc, run_id, "failed" if proc.returncode else "finished")
                self._proc = None
                return
            if proc.poll() is None and not stuck:
                self.store.request_control(run_id, control.STOP)
                _wait(proc, timeout)
            if proc.poll() is None:
                proc.terminate()  # SIGTERM: the runner's finally still shuts workers down
                _wait(proc, timeout)
            if proc.poll() is None:
                proc.kill()
                _wait(proc, timeout)
            self._finish_dead(proc, run_id, "stopped")
            self._proc = None

    def close(self) -> None:
        """Stop the workload and the reaper (dashboard exit, CLI end)."""
        if self._reaper.stopping:
            return
        self._reaper.stop(5)
        try:
            self.stop()
        finally:
            if self._forks is not None:
                self._forks.close()
            atexit.unregister(self.close)

    # -- state -------------------------------------------------------------------------
    def is_alive(self) -> bool:
        with self._lock:
            return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    # -- reaping -----------------------------------------------------------------------
    def _snapshot_children(self) -> None:
        """Remember the workload's descendants (DataLoader workers) so they can be killed
        even after their parent is gone and they have been re-parented."""
        proc = self._proc
        if proc is None or proc.pid is None:
            return
        try:
            for c in psutil.Process(proc.pid).children(recursive=True):
                self._children.setdefault(c.pid, c)
        except psutil.NoSuchProcess:
            pass

    def _finish_dead(self, proc: subprocess.Popen | spawn.Forked, run_id: int,
                     status: str) -> None:
        """After the workload process ended: kill leftovers, record the end if the workload
        could not (NOTE [shutdown protocol] in monitor/manage/runtime.py, 5)."""
        leftovers = [c for c in self._children.values() if c.is_running()]
        if leftovers:
            _kill_tree(leftovers)
        seen, self._children = set(self._children), {}
        with contextlib.suppress(Exception):  # a store that fails is said below, once
            left = remove_left_segments(self.store, run_id, proc.pid, seen)
            if left:
                self.store.add_event(run_id, SHM, f"removed {len(left)} /dev/shm segments "
                                     "the workload's killed processes left", {"removed": left})
        code = proc.returncode
        try:
            if code not in (0, None) and status != STOPPED:
                self.store.finish_run(run_id, FAILED, exit_text(code))
            else:
                self.store.finish_run(run_id, status)
        except Exception as exc:  # the store itself failed (disk full, file gone): say so
            why = explain(self.store.path, exc)
            self.last_error = f"could not record the end of run {run_id}: {why}"
            print(f"starvation-monitor: {self.last_error}", file=sys.stderr)
            # for the next start-up, which closes the run with it
            self.store.note_failure(run_id, f"the store could not be written: {why}")

    def _reap(self) -> None:
        """The workload's end noticed (its run closed), its children and reverts followed
        meanwhile (monitor/periodic.py's thread, every reap_interval)."""
        with self._lock:
            proc, run_id = self._proc, self.run_id
            if proc is None or run_id is None:
                return
            if proc.poll() is None:
                self._snapshot_children()
                self._follow_revert(run_id)
                return
            self._finish_dead(proc, run_id, "failed" if proc.returncode else "finished")
            self._proc = None

    def _follow_revert(self, run_id: int) -> None:
        """The workload went back to its last good settings after a failed move: those are
        the settings now (the page's sliders follow)."""
        key = control.reverted_key(run_id)
        if self.store.meta(key) is None:
            return
        self.store.set_meta(key, None)
        run = self.store.run(run_id) or {}
        with contextlib.suppress(ConfigError, TypeError, ValueError):
            self.config = LoaderConfig.from_dict(run.get("config") or {})

    def wait_for_steps(self, n: int, timeout: float) -> bool:
        """Block until the current run has recorded `n` steps (tests, CLI warm-up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run_id is not None and len(self.store.steps(self.run_id)) >= n:
                return True
            if not self.is_alive() and self.run_id is not None:
                return len(self.store.steps(self.run_id)) >= n
            time.sleep(0.1)
        return False
