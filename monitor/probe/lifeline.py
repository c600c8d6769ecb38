"""A process bound to its parent's life: the kernel kills it when the parent dies (NOTE
[bound to monitor run] below)."""

# NOTE [bound to monitor run]
# `monitor run` starts the script in a process group of its own (the terminal's Ctrl-C is the
# script's alone, as bare; monitor/manage/attached_run.py). A harness, a scheduler or
# `timeout -s KILL` that kills the launcher's group then killed `monitor run` and left the
# script training, holding its GPU, as an orphan; bare, the script dies with the group. So:
# 1. The script is started with PR_SET_PDEATHSIG = SIGKILL (spawn.start_script): when
#    `monitor run` dies, however, the kernel kills the script at once, as the group's SIGKILL
#    would have bare. The setting survives exec. It fires when the *thread* that forked the
#    child ends, so `monitor run` starts the script from its main thread.
# 2. A DataLoader worker (forked inside a loader's own __iter__, probe/patch.py) is bound the
#    same way to the process that forked it, so it goes within the second rather than at
#    torch's own check of its parent (every 5 s). Other children of the script are left as
#    they are: bare, they may outlive it.
# 3. The parent is checked after the call: one that died between the fork and the prctl is
#    already gone and would never signal.
# 4. Once the script's probe records under the relay (its ring made, its watchdog's thread
#    asleep on the FIFO that `monitor run` holds: NOTE [the relay], 5), it takes the binding
#    off itself (unbind) and its watchdog does the ending instead, so that nothing is lost:
#    woken by `monitor run`'s end, it takes back what the ring holds unstored, writes it,
#    ends the run as `failed`, "killed", and kills its own process group (its workers with
#    it). Before that (no loader iterated yet, a script that is not Python) the kernel's
#    SIGKILL ends it and whoever opens the store next ends the run (Runs.close_orphans).
# Linux only; elsewhere (no prctl) nothing is bound and everything runs as before.
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up before any fork: the child calls it and nothing else


def bind_to_parent(parent: int, sig: int = signal.SIGKILL) -> bool:
    """In a child just forked from `parent`: die by `sig` when it does (NOTE [bound to
    monitor run]). False where the kernel cannot."""
    if _PRCTL is None or _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # it died before the call: nothing would signal us
        os.kill(os.getpid(), sig)
    return True


def preexec(parent: int | None = None):
    """A `preexec_fn` for subprocess: the child dies with this process."""
    parent = os.getpid() if parent is None else parent

    def bind() -> None:
        bind_to_parent(parent)
    return bind


KILLED = ("killed: `monitor run` was killed, and the script with it, as the launcher's group "
          "kill would have ended it bare")


def unbind() -> None:
    """This process no longer dies by the kernel's signal with its parent (its probe's
    watchdog ends it instead: NOTE [bound to monitor run], 4)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, 0, 0, 0, 0)


def end_with_launcher(probe) -> None:
    """`monitor run` is gone: the probe's steps written, the run ended as killed, then this
    process's group (the script and its workers) killed, as the launcher's would have been."""
    for step in (lambda: probe.flush(final=True),
                 lambda: probe.store.finish_run(probe.run_id, "failed", KILLED)):
        try:
            step()
        except Exception:  # a store that fails here cannot be told: end all the same
            continue
    group = os.getpgrp()
    if group == os.getpid():
        os.killpg(group, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
