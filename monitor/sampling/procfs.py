"""What /proc says of a loading process that psutil does not: where its time goes.

- `/proc/<pid>/task/<tid>/schedstat`: per thread, nanoseconds on a CPU and nanoseconds
  runnable but waiting for one (the run queue). Summed over the process's threads, the
  difference between two readings splits a stretch of wall time into on-CPU, CPU wait and
  the rest, blocked (storage, network, locks, sleep).
- `/proc/<pid>/io`: bytes the process read (`rchar`: every read(), page cache hits included;
  `read_bytes`: what came from the block device), the storage evidence behind an io-bound
  verdict.

The /proc root is injected (DESIGN.md style rule 4), so tests point the readers at fixture
files. None where the kernel does not provide a file (non-Linux, schedstats off, another
user's process).
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedTimes:
    """Cumulative nanoseconds of one process (all its threads)."""

    on_cpu_ns: int
    runq_ns: int


def schedstat(pid: int, proc: str = "/proc") -> SchedTimes | None:
    """The process's threads' on-CPU and run-queue nanoseconds, summed; None when the
    process is gone or the kernel keeps no schedstat."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    on, wait, seen = 0, 0, False
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            on, wait, seen = on + int(fields[0]), wait + int(fields[1]), True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between listdir and open
    return SchedTimes(on, wait) if seen else None


def read_chars(pid: int, proc: str = "/proc") -> int | None:
    """Bytes the process has read through read() and friends (`rchar`), or None."""
    try:
        with open(f"{proc}/{pid}/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def available(proc: str = "/proc") -> dict[str, bool]:
    """Which of the readers work here (for `doctor` and the evidence table's notes)."""
    me = os.getpid()
    return {"schedstat": schedstat(me, proc) is not None,
            "io": read_chars(me, proc) is not None}
