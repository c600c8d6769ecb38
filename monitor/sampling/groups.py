"""Who else wants this host's CPUs, and in which scheduling group (NOTE [scheduling groups]
below)."""

# NOTE [scheduling groups]
# Linux's fair scheduler shares the CPUs between scheduling groups first, and between the
# tasks of a group second. A group is a cpu cgroup (v1 `cpu`, v2 with the cpu controller:
# Docker, Kubernetes, Slurm) weighted by its cpu.shares / cpu.weight, and, for tasks in the
# root cpu cgroup while /proc/sys/kernel/sched_autogroup_enabled is 1, an autogroup per
# session (each terminal, each ssh login, each `setsid`: another user's job), weighted by its
# nice. So more DataLoader workers take more CPU from a neighbour in their own group, and
# none from a neighbour in another group, which keeps its group's share: beside another
# session's two busy processes and a toggling one, 2 → 6 workers was predicted x1.57 by the
# per-task model and measured x0.98 bare (bench/predictions.py).
#
# Every SCAN_S the sampler reads, for every process but the job's own and the monitor's,
# its CPU (/proc/<pid>/stat) and its run-queue wait (/proc/<pid>/schedstat, the leader
# thread) since the last scan: its demand, the cores it wanted; and its group. The row
# holds, as JSON, the job's own group and each group's weight, demand and CPU
# (diagnosis/bound.py turns them into the share N loaders would get).
# Kernel threads are most of a host's PIDs (62 of 68 on this 2-core box, ~1,000 on a 96-core
# node) and rarely use a core: each is read at its first sight, then once in KTHREAD_EVERY
# scans (turns spread by PID), its CPU over that longer stretch standing for the scans
# between. Its PID is taken for a kernel thread's until then: PIDs are handed out in turn up
# to pid_max (4,194,304 where systemd sets it), so one reused within seconds is not expected.
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from monitor.sampling.procfs import pids, proc_stat, read_small

SCAN_S = 1.0  # seconds between scans of /proc (2.5 ms of CPU for 64 processes here)
PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread
KTHREAD_EVERY = 10  # scans between reads of a kernel thread (NOTE above)
MIN_DEMAND = 0.02  # cores: a process that wanted less is left out
NICE_0 = 1024  # the scheduler's weight of nice 0 (cpu.shares' default)


_read = read_small


def _nice_weight(nice: int) -> float:
    """The kernel's sched_prio_to_weight, near enough: 1.25x per nice step."""
    return NICE_0 / (1.25 ** nice)


def group_of(pid: int, proc: str = "/proc", root: str = "/sys/fs/cgroup",
             autogroups: bool = True) -> tuple[str, float]:
    """(key, weight) of the process's scheduling group: its cpu cgroup where it is not the
    root one, else its autogroup where they are on, else the root ("/"). Weight in units of
    a nice-0 task's."""
    path = None
    for line in (_read(f"{proc}/{pid}/cgroup") or "").splitlines():
        num, ctrls, p = (line.split(":", 2) + ["", ""])[:3]
        if "cpu" in ctrls.split(","):
            path, v1 = p, True
            break
        if num == "0" and path is None:
            path, v1 = p, False
    if path not in (None, "", "/"):
        if v1:
            shares = _read(f"{root}/cpu{path}/cpu.shares") or _read(
                f"{root}/cpu,cpuacct{path}/cpu.shares")
            w = float(shares) / NICE_0 if shares and shares.strip().isdigit() else 1.0
        else:
            weight = _read(f"{root}{path}/cpu.weight")
            w = float(weight) / 100 if weight and weight.strip().isdigit() else 1.0
        return f"cgroup:{path}", w
    if autogroups:
        text = (_read(f"{proc}/{pid}/autogroup") or "").split()
        if len(text) >= 3 and text[0].startswith("/autogroup-"):
            try:
                return f"autogroup:{text[0][11:]}", _nice_weight(int(text[2])) / NICE_0
            except ValueError:
                pass
    return "/", 1.0


def autogroups_on(proc: str = "/proc") -> bool:
    return (_read(f"{proc}/sys/kernel/sched_autogroup_enabled") or "0").strip() == "1"


class GroupScan:
    """The scan of NOTE [scheduling groups]; `sample(ours, own)` returns the JSON a host row
    holds, or None between scans (and on the first, which has nothing to compare with)."""

    def __init__(self, proc: str = "/proc", root: str = "/sys/fs/cgroup",
                 clock: Callable[[], float] = time.monotonic, every_s: float = SCAN_S) -> None:
        self.proc, self.root, self.clock, self.every_s = proc, root, clock, every_s
        self._prev: dict[int, tuple[float, float, int]] = {}  # pid -> (cpu s, runq s, threads)
        # kernel threads: pid -> (parent, CPU s and time at its last read, cores it used)
        self._kthreads: dict[int, tuple[int, float, float, float | None]] = {}
        self._t: float | None = None
        self._groups: dict[int, tuple[str, float]] = {}
        self.autogroups = autogroups_on(proc)
        # each scanned process's parent (every process but `ours`), and the scans so far:
        # the sampler finds a job's new descendants in them (HostSampler._tree)
        self.parents: dict[int, int] = {}
        self.scans = 0

    def _times(self, pid: int, now: float, last: tuple | None
               ) -> tuple[int, tuple[float, float, int]] | None:
        """(its parent, (CPU s, run-queue s, threads)) from its stat and schedstat; None for
        a process gone, or a kernel thread (kept in `_kthreads`; `last`: its last read)."""
        st = proc_stat(pid, self.proc)
        if st is None:
            return None
        if st.flags & PF_KTHREAD:  # its CPU counts, its run-queue wait is not read
            used = None if last is None or now <= last[2] else \
                min(1.0, max(0.0, st.cpu_s - last[1]) / (now - last[2]))
            self._kthreads[pid] = (st.ppid, st.cpu_s, now, used)
            return None
        sched = (_read(f"{self.proc}/{pid}/schedstat") or "").split()
        runq = int(sched[1]) / 1e9 if len(sched) >= 2 and sched[1].isdigit() else 0.0
        return st.ppid, (st.cpu_s, runq, st.threads)

    def sample(self, ours: set[int], own: int | None) -> str | None:
        now = self.clock()
        if self._t is not None and now - self._t < self.every_s:
            return None
        listed = pids(self.proc)
        if not listed:  # (/proc unreadable: it lists this process at least)
            return None
        cur: dict[int, tuple[float, float, int]] = {}
        parents: dict[int, int] = {}
        kthreads, self._kthreads = self._kthreads, {}
        for pid in listed:
            if pid in ours:
                continue
            if (k := kthreads.get(pid)) is not None and (pid + self.scans) % KTHREAD_EVERY:
                parents[pid], self._kthreads[pid] = k[0], k  # (not its turn)
                continue
            t = self._times(pid, now, k)
            if t is not None:
                parents[pid], cur[pid] = t
            elif pid in self._kthreads:
                parents[pid] = self._kthreads[pid][0]
        self.parents, self.scans = parents, self.scans + 1
        prev, before, self._prev, self._t = self._prev, self._t, cur, now
        if before is None or now <= before:
            return None
        dt = now - before
        # each process's (cores used, cores wanted) since the last scan; a kernel thread's
        # over its own stretch between reads
        rates = {pid: (used, used) for pid, (_, _, _, used) in self._kthreads.items()
                 if used is not None}
        for pid, (cpu, runq, threads) in cur.items():
            if pid in prev:
                used = max(0.0, cpu - prev[pid][0]) / dt
                # (the clock ticks and schedstat's ns disagree a little: a task wants at
                # most one core a thread)
                rates[pid] = (used, min(float(max(1, threads)),
                                        used + max(0.0, runq - prev[pid][1]) / dt))
        groups: dict[str, list[float]] = {}
        for pid, (used, demand) in rates.items():
            if demand < MIN_DEMAND:
                continue
            if pid not in self._groups:
                self._groups[pid] = group_of(pid, self.proc, self.root, self.autogroups)
            key, w = self._groups[pid]
            g = groups.setdefault(key, [w, 0.0, 0.0, 0])
            g[1] += demand
            g[2] += used
            g[3] += 1
        self._groups = {p: g for p, g in self._groups.items() if p in cur or
                        p in self._kthreads}
        mine = group_of(own, self.proc, self.root, self.autogroups) if own else ("/", 1.0)
        out: dict[str, Any] = {"own": mine[0], "own_weight": mine[1], "groups": [
            [k, round(w, 3), round(d, 3), round(u, 3), n] for k, (w, d, u, n) in groups.items()]}
        return json.dumps(out)
