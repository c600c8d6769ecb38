"""The calling thread's own time, inside the training process (standard library only): on a
CPU (time.thread_time: ~0.2 µs) and runnable but waiting for one (the second figure of
/proc/thread-self/schedstat, kept open a thread and read with one pread: ~1 µs alone, but
~10 µs a step in a loop receiving from two workers, bench/probe_cost.py, so read on one
receipt in RUNQ_EVERY). The probe reads both around the receiving of each batch a
DataLoader's workers made (monitor/probe/workers.py): a loop that receives works, and a loop
held by its workers' hand-off does neither (NOTE [the loop's receive] in
monitor/diagnosis/costs.py)."""
from __future__ import annotations

import os
import threading
import time

RUNQ_EVERY = 16  # receipts a wait for a CPU is read on: one in this many
_local = threading.local()
cpu = time.thread_time  # this thread's seconds on a CPU since it began


class _File:
    """A thread's schedstat, open; closed with the thread's locals."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _schedstat() -> _File | None:
    """This thread's schedstat file, opened once a thread (and again in a forked child, whose
    inherited one is its parent's thread's); None where the kernel keeps none."""
    pid = os.getpid()
    if getattr(_local, "pid", None) != pid:
        _local.pid = pid
        try:
            _local.file = _File()
        except OSError:
            _local.file = None
    return _local.file


def runq() -> float | None:
    """This thread's seconds runnable but waiting for a CPU since it began (None where the
    kernel does not say): complete whenever the thread itself reads it, running. (Its first
    figure, the CPU, is brought up to date only at the scheduler's tick or a switch: read by
    a thread at work it is up to a tick behind, and a 4 ms receipt read 25% on a CPU against
    15% by thread_time.)"""
    f = _schedstat()
    if f is None:
        return None
    try:
        return int(os.pread(f.fd, 96, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        _local.file = None
        return None
