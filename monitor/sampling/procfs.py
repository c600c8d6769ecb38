"""What /proc says of a loading process that psutil does not: where its time goes.

- `/proc/<pid>/task/<tid>/schedstat`: per thread, nanoseconds on a CPU and nanoseconds
  runnable but waiting for one (the run queue). Summed over the process's threads, the
  difference between two readings splits a stretch of wall time into on-CPU, CPU wait and
  the rest, blocked (storage, network, locks, sleep).
- `/proc/<pid>/io`: bytes the process read (`rchar`: every read(), page cache hits and
  sockets included; `read_bytes`: what the block layer fetched for it). Only `read_bytes`
  is storage evidence behind an io-bound verdict: a dataset of files in the page cache
  reads megabytes through read() and waits on no disk (timm on 400 cached JPEGs was once
  called io-bound on rchar alone).
- `/proc/<pid>/cgroup` and the memory controller's files under /sys/fs/cgroup: the memory
  limit that binds the process (its cgroup's or an ancestor's, v2 `memory.max` or v1
  `memory.limit_in_bytes`), which a container's job runs out of before the host does.

The /proc root is injected (DESIGN.md style rule 4), so tests point the readers at fixture
files. None where the kernel does not provide a file (non-Linux, schedstats off, another
user's process).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

BUSY_THREAD = 0.2  # of a pass: a thread that wanted a CPU this long was at work in it


@dataclass(frozen=True, slots=True)
class SchedTimes:
    """Cumulative nanoseconds of one process (all its threads), and each thread's."""

    on_cpu_ns: int
    runq_ns: int
    threads: tuple[tuple[str, int, int], ...] = ()  # (tid, on-CPU, run queue)

    def runq_since(self, before: SchedTimes) -> int:
        """Run-queue nanoseconds since `before`, thread by thread: a thread that ended in
        between takes its time out of the process's sum (a Ray rank's threads come and go:
        the sums' difference read negative), so only threads alive at both reads count, and
        those born since count whole."""
        then = {t: w for t, _, w in before.threads}
        return sum(max(0, w - then.get(t, 0)) for t, _, w in self.threads)

    def busy_threads_since(self, before: SchedTimes, dt_s: float) -> int:
        """Threads that wanted a CPU (on one, or waiting for one) at least BUSY_THREAD of
        the time since `before`: a library's pool at work (OpenBLAS, OpenMP, OpenCV),
        beside the one thread a loader needs."""
        if dt_s <= 0:
            return 0
        then = {t: (on, w) for t, on, w in before.threads}
        return sum(1 for t, on, w in self.threads
                   if (on + w - sum(then.get(t, (0, 0)))) / 1e9 >= BUSY_THREAD * dt_s)


def schedstat(pid: int, proc: str = "/proc") -> SchedTimes | None:
    """The process's threads' on-CPU and run-queue nanoseconds, summed and per thread; None
    when the process is gone or the kernel keeps no schedstat."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    threads = []
    for tid in tids:
        fields = (read_small(f"{proc}/{pid}/task/{tid}/schedstat") or "").split()
        try:
            threads.append((tid, int(fields[0]), int(fields[1])))
        except (ValueError, IndexError):
            continue  # a thread that ended between listdir and open
    if not threads:
        return None
    return SchedTimes(sum(t[1] for t in threads), sum(t[2] for t in threads), tuple(threads))


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What a process's /proc/<pid>/stat says in one read: its state letter (R, S, D, Z,
    ...), its CPU seconds (user + system), its start (clock ticks after boot: with the PID,
    who it is; a PID reused by another process starts later), its parent, its threads, its
    flags (PF_KTHREAD: a kernel thread), the CPU seconds of the children it waited for
    (cutime + cstime) and its resident bytes (psutil's rss: statm's resident pages)."""

    state: str
    cpu_s: float
    start: int
    ppid: int
    threads: int
    flags: int
    children_cpu_s: float
    rss: int


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# psutil's names of the kernel's state letters (its status())
STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped",
          "t": "tracing-stop", "Z": "zombie", "X": "dead", "x": "dead", "K": "wake-kill",
          "W": "waking", "I": "idle", "P": "parked"}


def pids(proc: str = "/proc") -> list[int]:
    """Every process's PID on the host (none where /proc cannot be listed)."""
    try:
        return [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return []


def proc_stat(pid: int, proc: str = "/proc") -> ProcStat | None:
    """The process's stat fields above in one raw read; None when it is gone."""
    f = (read_small(f"{proc}/{pid}/stat") or "").rpartition(")")[2].split()
    try:  # (fields after the command's closing parenthesis, from the state on)
        return ProcStat(f[0], (int(f[11]) + int(f[12])) / TICK, int(f[19]), int(f[1]),
                        int(f[17]), int(f[6]), (int(f[13]) + int(f[14])) / TICK,
                        int(f[21]) * PAGE)
    except (IndexError, ValueError):
        return None


class StatPass:
    """The job's processes' stat, read once a sampler pass: psutil's is_running, cpu_times,
    cpu_percent, num_threads and status read that file once each, memory_info reads statm
    (~20-80 µs a call here: four a pass for a rank's main process, four for each worker)
    where one raw read (~5 µs) holds them all. `running(proc)` stands for is_running: the
    process (a psutil.Process, or anything with its pid) is gone, or its PID was taken by
    another process since that object first read it (a later start); what it read stays
    for the pass (`now`, `cpu_s`, `status`)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._born: dict[int, tuple[Any, int]] = {}  # pid -> (its object, its start)
        self._now: dict[int, ProcStat] = {}

    def running(self, p: Any) -> bool:
        st = proc_stat(p.pid, self.proc)
        if st is None:
            return False
        born = self._born.get(p.pid)
        if born is None or born[0] is not p:
            born = self._born[p.pid] = (p, st.start)
        self._now[p.pid] = st
        return born[1] == st.start

    def now(self, pid: int) -> ProcStat | None:
        """Its stat as this pass read it (read now if the pass has not yet)."""
        if (st := self._now.get(pid)) is None and (st := proc_stat(pid, self.proc)):
            self._now[pid] = st
        return st

    def cpu_s(self, pid: int) -> float | None:
        return st.cpu_s if (st := self._now.get(pid)) is not None else None

    def status(self, pid: int) -> str | None:
        return STATES.get(st.state) if (st := self._now.get(pid)) is not None else None

    def end_pass(self, live: set[int | None]) -> None:
        self._born = {p: b for p, b in self._born.items() if p in live}
        self._now = {}


def storage_reads(pid: int, proc: str = "/proc") -> int | None:
    """Bytes the block layer has read for the process (`read_bytes`: storage, never the
    page cache), or None."""
    got = io_counts(pid, proc)
    return got[1] if got is not None else None


def io_counts(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(rchar, read_bytes) of a process from /proc/<pid>/io: all it read through read()
    (sockets and the page cache too), and what the block device served; None if unread."""
    got: dict[str, int] = {}
    try:
        for line in (read_small(f"{proc}/{pid}/io") or "").splitlines():
            k, _, v = line.partition(":")
            if k in ("rchar", "read_bytes"):
                got[k] = int(v)
    except ValueError:
        return None
    return (got["rchar"], got["read_bytes"]) if len(got) == 2 else None


def read_text(path: str) -> str | None:
    """A /proc or /sys file's text, or None when it cannot be read."""
    return _read(path, whole=True)


def read_small(path: str) -> str | None:
    """A file the kernel writes in one go (a process's stat, schedstat, io, cgroup; a cgroup
    attribute): one read of the raw descriptor, 5 µs here against 12 µs through open() (the
    sampler reads ~100 such files a pass). Not for files of many records (maps, smaps,
    cpuinfo: procfs hands them out a page at a time)."""
    return _read(path, whole=False)


def _read(path: str, whole: bool) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, 65536)]
        while whole and chunks[-1]:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


UNLIMITED = 1 << 60  # v1 reports "no limit" as a page-rounded 2**63


def _number(path: str) -> int | None:
    text = (read_small(path) or "").strip()
    return int(text) if text.isdigit() else None  # v2 "max": no limit


def memory_limits(pid: int, proc: str = "/proc",
                  root: str = "/sys/fs/cgroup") -> list[tuple[float, str]]:
    """The memory limits over the process (its cgroup's and its ancestors', v1 or v2), each
    with the file that says what that cgroup uses: the limits stay, the use is read again
    (least_room: the one that leaves the process the least room)."""
    lines = [ln.split(":", 2) for ln in (read_small(f"{proc}/{pid}/cgroup") or "").splitlines()]
    v1 = [p for p in lines if len(p) == 3 and "memory" in p[1].split(",")]
    v2 = [p for p in lines if len(p) == 3 and p[0] == "0" and p[1] == ""]
    if v1:  # the memory controller on v1 (a hybrid host keeps v2 without it)
        where, limit_f, used_f, base = (v1[0][2], "memory.limit_in_bytes",
                                        "memory.usage_in_bytes", os.path.join(root, "memory"))
    elif v2:
        where, limit_f, used_f, base = v2[0][2], "memory.max", "memory.current", root
    else:
        return []
    out, path = [], where.strip("/")
    while True:
        d = os.path.join(base, path) if path else base
        limit = _number(os.path.join(d, limit_f))
        if limit is not None and limit < UNLIMITED:
            out.append((float(limit), os.path.join(d, used_f)))
        if not path:
            return out
        path = os.path.dirname(path)


def least_room(limits: list[tuple[float, str]]) -> tuple[float, float] | None:
    """(limit, used) of the limit with the least room left now, None if none is read."""
    best = None
    for limit, used_f in limits:
        used = _number(used_f)
        if used is not None and (best is None or limit - used < best[0] - best[1]):
            best = (limit, float(used))
    return best


def available(proc: str = "/proc") -> dict[str, bool]:
    """Which of the readers work here (for `doctor` and the evidence table's notes)."""
    me = os.getpid()
    return {"schedstat": schedstat(me, proc) is not None,
            "io": storage_reads(me, proc) is not None}
