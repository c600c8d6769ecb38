"""The one way this project starts a child process of its own (a managed workload, the
collector process, a workload check, a user's script under the probe): which interpreter,
which import path, which environment.

Our children run `python -m PACKAGE.MODULE` with the folder that holds `monitor/` first on
PYTHONPATH, so they import the same code as their parent, from a checkout or an installed
package alike. A user's script is different: it runs in *its* interpreter (maybe a venv
without our dependencies), and gets on its path only the probe's `sitecustomize` and a
private folder holding nothing but a link to `monitor/` (the probe needs torch and the
standard library only), never our site-packages.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from monitor.probe import lifeline

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds monitor/ and workloads/
PACKAGE = ROOT / "monitor"
INJECT = PACKAGE / "probe" / "_inject"


def _path(*first: str, env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return os.pathsep.join(p for p in (*first, env.get("PYTHONPATH")) if p)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of one of our own children: ours, with our packages importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = _path(str(ROOT), env=env)
    env.update(extra)
    return env


def module_command(module: str, *args: str) -> list[str]:
    """`this-python -m module args...`."""
    return [sys.executable, "-m", module, *args]


# Streamlit's settings for every page this project serves, given on its command line (a
# file in the checkout's .streamlit/ is not there for a pip-installed dashboard, nor when it
# is started from another folder): nothing sent out (usage statistics, the toolbar's Deploy
# button), no browser opened, no file watcher, no gc.collect() after every rerun (with the
# live region refreshing each second it took half the server's CPU: py-spy, 52% in
# ScriptRunner._on_script_finished).
STREAMLIT_SETTINGS = {
    "browser.gatherUsageStats": "false",
    "server.headless": "true",
    "client.toolbarMode": "minimal",
    "global.developmentMode": "false",
    "server.fileWatcherType": "none",
    "server.runOnSave": "false",
    "runner.postScriptGC": "false",
    "theme.base": "light",
}


def streamlit_command(page: str | Path, address: str, port: int,
                      extra: Sequence[str] = ()) -> list[str]:
    """`streamlit run PAGE` bound to address:port with STREAMLIT_SETTINGS; `extra` goes to
    the page's own arguments."""
    flags = [f"--{k}={v}" for k, v in STREAMLIT_SETTINGS.items()]
    return [*module_command("streamlit", "run", str(page), "--server.address", address,
                            "--server.port", str(port), f"--browser.serverAddress={address}",
                            *flags), *(["--", *extra] if extra else [])]


def start(module: str, *args: str, env: dict[str, str] | None = None,
          **popen: Any) -> subprocess.Popen:
    """Start one of our modules as a child; its output goes to our stderr (a CLI's stdout
    stays its JSON) and it reads nothing from our stdin."""
    return subprocess.Popen(module_command(module, *args), stdin=subprocess.DEVNULL,
                            stdout=sys.stderr, stderr=sys.stderr,
                            env=env if env is not None else child_env(), cwd=str(ROOT),
                            **popen)


def run(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one of our modules to completion, capturing its output (TimeoutExpired past
    `timeout`)."""
    return subprocess.run(module_command(module, *args), capture_output=True, text=True,
                          timeout=timeout, env=child_env(), stdin=subprocess.DEVNULL)


_probe_dir: str | None = None


def probe_path() -> str:
    """A folder holding only `monitor` (a link to this package), made once per process and
    removed at exit: what a user's interpreter needs to import the probe, and nothing else
    of ours (an installed package's site-packages would bring pandas and the rest along)."""
    global _probe_dir
    if _probe_dir is None or not os.path.isdir(_probe_dir):
        d = tempfile.mkdtemp(prefix="starvation-probe-")
        try:
            os.symlink(PACKAGE, os.path.join(d, "monitor"), target_is_directory=True)
        except OSError:  # no symlinks here: a copy of the package does the same
            shutil.copytree(PACKAGE, os.path.join(d, "monitor"),
                            ignore=shutil.ignore_patterns("__pycache__"))
        atexit.register(lambda: shutil.rmtree(d, ignore_errors=True))
        _probe_dir = d
    return _probe_dir


def script_env(extra: dict[str, str]) -> dict[str, str]:
    """A user's script's environment: ours, the probe's sitecustomize first on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = _path(str(INJECT), probe_path(), env=env)
    env.update(extra)
    return env


def start_script(cmd: Sequence[str], env: dict[str, str],
                 piped: bool = False) -> subprocess.Popen:
    """A user's command, in a process group of its own (its workers die with it), killed by
    the kernel when this process dies (NOTE [bound to monitor run] in
    monitor/probe/lifeline.py: call this from the main thread); `piped`: its stdout and
    stderr come to us, unbuffered (the terminal live view relays them)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    bound = {"process_group": 0, "preexec_fn": lifeline.preexec()}
    if piped:
        return subprocess.Popen(list(cmd), env={**env, "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **bound)
    return subprocess.Popen(list(cmd), env=env, **bound)


class Forked:
    """A workload process forked by the fork server: the part of subprocess.Popen that the
    session manager uses (pid, poll, wait, terminate, kill, returncode). Its exit status
    comes from the server, which is its parent and reaps it."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server, self.pid = server, pid
        self.args = ["workloads.runner"]

    @property
    def returncode(self) -> int | None:
        return self._server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """`python -m workloads.forkserver`, started on the first workload and kept until
    `close()`: it forks each workload from an interpreter that has imported torch once
    (workloads/forkserver.py says why that is safe). When it cannot start or has died,
    `start()` says so with None and the caller spawns the workload as before."""

    READY_TIMEOUT_S = 60.0  # the server's own start: an interpreter and `import torch`

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one request at a time
        self._cond = threading.Condition()
        self._pids: list[int] = []
        self._exits: dict[int, int] = {}
        self._ready = False
        self._failed = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def ensure(self) -> int | None:
        """The running server's pid (started now if need be), None if it is not available."""
        with self._lock:
            return self.pid if self._ensure() else None

    def _ensure(self) -> bool:
        if self._failed:
            return False
        if self._proc is not None and self._proc.poll() is None:
            return True
        if self._proc is not None:  # it died: its workloads' exits are no longer known
            self._failed = True
            return False
        self._proc = subprocess.Popen(module_command("workloads.forkserver"),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=sys.stderr, env=child_env(), cwd=str(ROOT))
        threading.Thread(target=self._read, args=(self._proc,), name="fork-server-reader",
                         daemon=True).start()
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._proc.poll() is not None,
                                timeout=self.READY_TIMEOUT_S)
            if not self._ready:
                self._failed = True
        return self._ready

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                if "ready" in msg:
                    self._ready = True
                elif "pid" in msg:
                    self._pids.append(int(msg["pid"]))
                elif "exit" in msg:
                    self._exits[int(msg["exit"])] = int(msg["code"])
                self._cond.notify_all()
        with self._cond:  # the server ended: nothing more will come
            self._cond.notify_all()

    def start(self, args: Sequence[str]) -> Forked | None:
        """Fork a `workloads.runner` with `args` and our children's environment now (as
        `start` gives a spawned one); None when the server is not available."""
        with self._lock:
            if not self._ensure():
                return None
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write((json.dumps(
                    {"args": list(args), "env": child_env()})
                    + "\n").encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._failed = True
                return None
            with self._cond:
                if not self._cond.wait_for(lambda: self._pids or self._proc.poll() is not None,
                                           timeout=self.READY_TIMEOUT_S) or not self._pids:
                    self._failed = True
                    return None
                return Forked(self, self._pids.pop(0))

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
        if self._proc is not None and self._proc.poll() is not None and not psutil.pid_exists(pid):
            return -signal.SIGKILL  # the server died first: the end is not known, only that
        return None

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or (
                self._proc is not None and self._proc.poll() is not None), timeout=timeout)
        return self.exit_code(pid)

    def close(self, timeout: float = 5.0) -> None:
        """End the server (its stdin closed); its workloads were stopped before."""
        proc, self._proc = self._proc, None
        self._failed = True
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
        if proc.stdout is not None:
            proc.stdout.close()
