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
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    """A user's command, in a process group of its own (its workers die with it); `piped`:
    its stdout and stderr come to us, unbuffered (the terminal live view relays them)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if piped:
        return subprocess.Popen(list(cmd), env={**env, "PYTHONUNBUFFERED": "1"},
                                process_group=0, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    return subprocess.Popen(list(cmd), env=env, process_group=0)
