"""A warm start for managed workloads: one process per session manager that imports torch
once, then forks one workload process per run (multiprocessing's "forkserver" idea). Each
configuration of a sweep or a tune, each restart from the page, then starts in a fraction of
a second instead of paying a fresh interpreter and `import torch` again (about 3 s of CPU on
a 2-core box, more than the 1.5 s a tune may measure a configuration for).

Fork is safe here where it is not in the dashboard: this process is single-threaded (no
reaper thread: children are reaped between reads), holds no CUDA context and no store, and
imports only third-party modules before it forks. Our own modules are imported in each child,
after the run's environment is set, as a fresh interpreter would.

Protocol, one JSON line each way (stdin from the session manager, stdout to it):
  -> {"args": [runner arguments], "env": {environment}}   <- {"pid": N}
  <- {"exit": N, "code": C}   when workload N ends (C as subprocess.Popen gives it: -signal)
End of stdin (the manager closed it, or died) ends the server; its workloads then see their
parent gone and stop (NOTE [shutdown protocol] in monitor/manage/runtime.py, 2).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import traceback

PRELOAD = ("torch", "torch.utils.data", "numpy")
PR_SET_NAME = 15


def _say(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(req: dict, wake: tuple[int, int]) -> int:
    """In the forked child: become the workload process; returns its exit code."""
    signal.set_wakeup_fd(-1)
    for fd in wake:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # as spawn.start gives it: nothing to read, our stderr to write to
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(Exception):  # what `top` and `ps -o comm` call it (its cmdline
        ctypes.CDLL(None).prctl(PR_SET_NAME, b"sm-workload", 0, 0, 0)  # stays the server's)
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["workloads.runner", *req["args"]]
    try:
        from workloads import runner

        runner.cli(req["args"])
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def serve() -> int | None:
    """The server's loop: None when it ends; in a forked child, the workload's exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the manager
    for name in PRELOAD:
        __import__(name)
    wake = os.pipe()  # SIGCHLD wakes the select: an ended workload is reported at once
    os.set_blocking(wake[1], False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _say({"ready": os.getpid()})
    pending = b""
    while True:
        try:
            ready, _, _ = select.select([0, wake[0]], [], [])
        except InterruptedError:
            continue
        if wake[0] in ready:
            os.read(wake[0], 512)
            _reap()
        if 0 not in ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the manager closed its end, or died
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = os.fork()
            if pid == 0:
                return _child(json.loads(line), wake)
            _say({"pid": pid})


if __name__ == "__main__":
    code = serve()
    if code is None:  # the server: nothing to flush or close, no teardown of torch to wait for
        os._exit(0)
    sys.exit(code)
