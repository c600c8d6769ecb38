"""Host sampling through psutil: CPU per core, memory, /dev/shm, and the workload's process
tree (its DataLoader workers are its children).

The psutil module, the shm path and the clock are injected with real defaults (DESIGN.md
style rule 4), so tests can point the sampler at a stand-in.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil as _psutil

from monitor.records import HostSample
from monitor.sampling import procfs
from monitor.sampling.groups import GroupScan
from monitor.sampling.own import OwnProcesses
from monitor.sampling.sockets import NetReads

MB = 1024 * 1024
# NOTE [one worker's USS a read]
# USS (private pages) is counted by the kernel walking the page tables (smaps_rollup: 6-13 ms
# of CPU a forked torch worker of 250 MB RSS here): 4 workers read together were 40% of the
# sampler's CPU at one rank. A worker not read yet is read at once (a new set whole; workers
# that start a pass or two apart, each once); then one worker a read, the one most overdue,
# the total being each one's as last read (a worker gone takes its part with it). A worker
# is due USS_EVERY passes a worker after its last read (every 8 s of 4 workers), USS_BACKOFF
# times later where that read rose USS_RISE_MB or less: over that stretch, workers growing so
# little grow slower than the rate diagnosis names (MEM_GROWTH_MB_MIN, 30 MB/min), whatever
# their number. Workers that grow alike (a dataset's copy-on-read, a cache) rise at every
# read and keep the full rate; workers that rose once as they warmed up are read at the slow
# one after their next read (node_cost's: a rise of 3-6.5 MB each, then flat).
# passes (0.25 s each) between costlier reads; bench/node_cost.py measures what a pass costs
USS_EVERY = 8  # the workers' USS, one worker a read (growth is named after two rises in a
# window's later half: fewer reads name it later) ...
USS_BACKOFF, USS_RISE_MB = 4, 1.0  # ... x USS_BACKOFF for a worker whose last read was flat
TREE_EVERY = 8  # the followed process's descendants by a scan of every process on the host,
# where the groups scan (once a second) found none for this long
NET_EVERY = 4  # the loaders' sockets and reads (their descriptors listed: ~1 ms a pass for 5
# processes); the passes between repeat them
CGROUP_EVERY = 40  # the memory limits over a process (its cgroup's and its ancestors')


def _safe(fn: Callable[[], Any], default: Any = None) -> Any:
    """One read, with 'gone' or 'not permitted' turned into a missing value."""
    try:
        return fn()
    except (_psutil.Error, OSError, ValueError):
        return default


class HostSampler:
    """Samples the host and the watched process tree; `sample()` returns a HostSample."""

    def __init__(self, psutil: ModuleType = _psutil, shm_path: str = "/dev/shm",
                 clock: Callable[[], float] = time.time, proc: str = "/proc") -> None:
        self.psutil = psutil
        self.shm_path = shm_path
        self.clock = clock
        self.proc = proc
        self._prev: dict[int | None, dict[str, Any]] = {}  # the last pass's /proc readings
        self._io: dict[int | None, dict[int, tuple[int, int] | None]] = {}  # this pass's io
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._run_id: int | None = None
        self._procs: dict[int, Any] = {}  # cpu_percent needs the same object between calls
        self._kids: dict[int, list[Any]] = {}  # descendants by PID, refreshed now and then
        # by PID: the groups scan its descendants are from, and the pass they were refreshed
        self._scanned: dict[int, tuple[int, int]] = {}
        # key -> (the pass, the fields, the workers) of the last look at the loaders' sockets
        self._net_rows: dict[int | None, tuple[int, dict, list[int]]] = {}
        self._limits: dict[int, tuple[int, list[tuple[float, str]]]] = {}  # pid -> (pass, ...)
        self._ranks: dict[int, int] = {}  # rank -> PID of a distributed job's processes
        self._passes = 0
        self._uss: dict[int | None, float] = {}
        self._uss_at: dict[int | None, int] = {}  # the pass of each key's last USS read
        # by worker PID: the pass of its last read, and whether that read was flat
        self._uss_when: dict[int | None, dict[int, tuple[int, bool]]] = {}
        self._uss_each: dict[int | None, dict[int, float | None]] = {}  # by worker PID
        self._wcpu: dict[int | None, dict[str, Any]] = {}  # workers' CPU seconds, last pass
        self._main_cpu: dict[int | None, tuple[int, float, float]] = {}  # (pid, CPU s, when)
        self._threads: dict[int, int | None] = {}  # thread count by PID, last pass
        self._ours = OwnProcesses(proc)  # the monitor's own processes and their CPU
        self._scan = GroupScan(proc=proc)  # NOTE [scheduling groups] in groups.py
        self._net = NetReads(proc)  # NOTE [remote reads] in sockets.py
        self._stat = procfs.StatPass(proc)  # the job's processes' stat, once a pass
        psutil.cpu_percent(percpu=True)  # prime: the first call has nothing to compare with

    def follow(self, pid: int | None, run_id: int | None) -> None:
        with self._lock:
            self._pid, self._run_id = pid, run_id
            self._procs = {}
            self._kids, self._ranks = {}, {}
            self._passes, self._uss, self._prev, self._io = 0, {}, {}, {}
            self._uss_at, self._uss_when = {}, {}
            self._wcpu, self._threads, self._uss_each, self._main_cpu = {}, {}, {}, {}
            self._net, self._net_rows, self._scanned = NetReads(self.proc), {}, {}
            self._limits = {}

    def follow_ranks(self, ranks: dict[int, int]) -> None:
        """The rank -> PID map of a distributed job under the followed process: each rank
        then gets a row of its own, its DataLoader workers attributed to it (rank processes
        are never counted as workers)."""
        with self._lock:
            self._ranks = dict(ranks)
            self._kids = {}  # rescanned at the next pass, the other ranks left out

    def _proc(self, pid: int) -> Any:
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = self.psutil.Process(pid)
        return p

    def _tree(self, pid: int) -> tuple[Any | None, list[Any]]:
        """A process and its descendants. Finding descendants scans every process on the
        host (psutil reads /proc for each; a thousand kernel threads on a large node): so
        the list is scanned for at once when the process's thread count changed (a
        DataLoader starting workers starts its queue feeder and pin-memory threads with
        them, so new workers are found within a pass), else refreshed from the parents the
        scheduling-groups scan read (once a second, the same /proc files), or one pass in
        TREE_EVERY passes without one; between refreshes dead ones drop out."""
        try:
            main = self._proc(pid)
            if not self._stat.running(main):  # (gone, or its PID another's: a new object)
                self._procs.pop(pid, None)
                return None, []
            threads = self._stat.now(pid).threads
            moved, self._threads[pid] = threads != self._threads.get(pid), threads
            scans, (seen, at) = self._scan.scans, self._scanned.get(pid, (-1, -TREE_EVERY))
            if pid not in self._kids or moved or (
                    scans == seen and self._passes - at >= TREE_EVERY):
                self._kids[pid] = self._own(pid, main.children(recursive=True))
                self._scanned[pid] = (scans, self._passes)
            elif scans != seen:
                self._kids[pid] = self._joined(pid, self._kids[pid])
                self._scanned[pid] = (scans, self._passes)
            kids = self._kids[pid] = [k for k in self._kids[pid] if self._stat.running(k)]
        except (_psutil.Error, OSError):
            return None, []
        workers = []
        for k in kids:
            try:
                workers.append(self._proc(k.pid))
            except (_psutil.Error, OSError):
                pass
        return main, workers

    def _joined(self, pid: int, kids: list[Any]) -> list[Any]:
        """`kids`, and the processes the last groups scan found under them or `pid` (it
        reads every process but the job's known ones, with its parent); the caller drops
        the ones no longer running."""
        tree, grew = {pid, *(k.pid for k in kids)}, True
        parents, new = self._scan.parents, []
        while grew:
            born = [c for c, pp in parents.items() if pp in tree and c not in tree]
            tree.update(born)
            new += born
            grew = bool(born)
        return self._own(pid, kids + [p for c in new
                                      if (p := _safe(lambda c=c: self.psutil.Process(c)))])

    def _own(self, pid: int, kids: list[Any]) -> list[Any]:
        """A rank's descendants less the other ranks and theirs: under Lightning's DDP
        launcher rank 0 is the script's process and the other ranks are its children."""
        others = {p for p in self._ranks.values() if p != pid}
        if not others & {k.pid for k in kids}:
            return kids
        parent = {k.pid: _safe(k.ppid) for k in kids}  # one /proc stat read each, no scan
        drop, grew = set(others), True
        while grew:  # a rank's descendants: whatever has a dropped parent
            new = {c for c, pp in parent.items() if pp in drop and c not in drop}
            drop |= new
            grew = bool(new)
        return [k for k in kids if k.pid not in drop]

    def _targets(self) -> list[tuple[int | None, int]]:
        """(rank, pid) to sample: each rank of a job (the followed process too when it is
        one: Lightning's launcher runs rank 0 in it; torchrun's agent is none), else the
        followed process (rank None)."""
        if self._pid is None:
            return []
        if set(self._ranks.values()) <= {self._pid}:  # one process: no ranks to tell apart
            return [(None, self._pid)]
        return sorted(self._ranks.items())

    def _workers_cpu(self, key: int | None, workers: list[Any],
                     room_pct: float | None) -> float | None:
        """The workers' CPU since the last pass, in % of one core, from their cumulative CPU
        times. A worker first seen now started since the scan before, which did not list it
        (psutil's cpu_percent would drop its first interval): it is owed all the CPU it used
        since it started, else a new worker's first second, when it works hardest, reads as
        other processes' load. Workers already there at the first pass are its baseline.
        What is owed is reported as the host's capacity leaves room for it (`room_pct`:
        every core's 100% less the main process's), the rest in the next passes, so a
        window's mean holds all the workers' CPU and no sample more than the host has."""
        now = time.time()
        prev = self._wcpu.get(key)
        cur: dict[int, float] = {}
        measured, owed = 0.0, prev["owed"] if prev else 0.0
        for w in workers:
            if (c := self._stat.cpu_s(w.pid)) is None:  # (gone: _tree dropped it)
                continue
            cur[w.pid] = c
            if prev is None:
                continue
            if w.pid in prev["cpu"]:
                measured += max(0.0, c - prev["cpu"][w.pid])
            else:  # started since the scan before: none of its CPU was counted
                owed += c
        self._wcpu[key] = {"t": now, "cpu": cur, "owed": owed}
        if prev is None or now <= prev["t"]:
            return None
        dt = now - prev["t"]
        pct = 100.0 * measured / dt
        room = owed if room_pct is None else max(0.0, room_pct - pct) / 100.0 * dt
        paid = min(owed, room)
        self._wcpu[key]["owed"] = owed - paid
        return pct + 100.0 * paid / dt

    def _process_fields(self, key: int | None, main: Any, workers: list[Any],
                        capacity_pct: float | None = None) -> dict:
        if main is None:
            return {}
        st, now = self._stat.now(main.pid), time.monotonic()
        if st is None:  # (gone since _tree)
            return {}
        prev, self._main_cpu[key] = self._main_cpu.get(key), (main.pid, st.cpu_s, now)
        proc_cpu = 100.0 * (st.cpu_s - prev[1]) / (now - prev[2]) \
            if prev is not None and prev[0] == main.pid and now > prev[2] else None
        room = None if capacity_pct is None else capacity_pct - (proc_cpu or 0.0)
        w_rss = [ws.rss / MB if (ws := self._stat.now(w.pid)) else None for w in workers]
        self._workers_uss(key, workers)
        before = self._wcpu.get(key)
        workers_cpu = self._workers_cpu(key, workers, room)
        return dict(
            proc_cpu_pct=proc_cpu,
            proc_rss_mb=st.rss / MB,
            workers=len(workers),
            workers_cpu_pct=workers_cpu,
            workers_rss_mb=sum(r for r in w_rss if r is not None),
            workers_uss_mb=self._uss.get(key),
            workers_detail=self._detail(key, workers, w_rss, before),
            **self._time_split(key, main, workers),
            **self._net_fields(key, main.pid, [w.pid for w in workers]),
            **self._cgroup(main.pid),
        )

    def _net_fields(self, key: int | None, main: int, workers: list[int]) -> dict:
        """NOTE [remote reads] in sockets.py, one pass in NET_EVERY (and at once for new
        workers); the passes between repeat the last: a share of passes that saw a peer, and
        a rate of bytes, read the same."""
        last = self._net_rows.get(key)
        if last is None or self._passes - last[0] >= NET_EVERY or last[2] != workers:
            last = self._net_rows[key] = (self._passes, self._net.sample(
                key, main, workers, self._io.get(key)), workers)
        return last[1]

    def _workers_uss(self, key: int | None, workers: list[Any]) -> None:
        """The workers' USS: each worker's as last read, their total in `_uss` (NOTE [one
        worker's USS a read]); workers gone since leave it with their memory."""
        each, when = self._uss_each.get(key, {}), self._uss_when.get(key, {})
        if len(each) != len(workers) or any(w.pid not in each for w in workers):
            live = {w.pid for w in workers}
            each = {p: u for p, u in each.items() if p in live}
            when = {p: v for p, v in when.items() if p in live}
        if (read := self._uss_due(key, workers, when)) is not None:
            got = {w.pid: _safe(lambda w=w: w.memory_full_info().uss / MB) for w in read}
            # (turns shifted by rank: 8 ranks' workers read in one pass held it 0.1 s)
            at = self._passes - (0 if key in self._uss_at else (key or 0) % USS_EVERY)
            when = {**when, **{p: (at, u is not None and (b := each.get(p)) is not None
                                   and u - b <= USS_RISE_MB) for p, u in got.items()}}
            each = {**each, **got}
            self._uss_at[key] = at
        self._uss_each[key], self._uss_when[key] = each, when
        self._uss[key] = sum(u for u in each.values() if u is not None)

    def _uss_due(self, key: int | None, workers: list[Any],
                 when: dict[int, tuple[int, bool]]) -> list[Any] | None:
        """The workers whose USS this pass reads (None: none is due): workers not read yet
        at once (a new set whole), else, USS_EVERY passes or more after the last read, the
        worker most overdue (`when`: each one's last read and whether it was flat)."""
        if key not in self._uss_at or (fresh := [w for w in workers if w.pid not in when]):
            return workers if key not in self._uss_at else fresh
        if not workers or self._passes - self._uss_at[key] < USS_EVERY:
            return None
        full = USS_EVERY * len(workers)
        over, w = max(((self._passes - when[w.pid][0] - full * (
            USS_BACKOFF if when[w.pid][1] else 1), w) for w in workers), key=lambda x: x[0])
        return [w] if over >= 0 else None

    def _cgroup(self, pid: int) -> dict[str, float]:
        """The memory limit over the process that leaves it the least room, and what its
        cgroup uses: the limits looked up one pass in CGROUP_EVERY (a container's are set
        at its start), the use read each pass."""
        last = self._limits.get(pid)
        if last is None or self._passes - last[0] >= CGROUP_EVERY:
            last = self._limits[pid] = (self._passes, procfs.memory_limits(pid, self.proc))
        got = procfs.least_room(last[1])
        return {} if got is None else {"cgroup_mem_limit_mb": got[0] / MB,
                                       "cgroup_mem_used_mb": got[1] / MB}

    def _detail(self, key: int | None, workers: list[Any], rss: list[float | None],
                before: dict | None) -> str | None:
        """Each worker: its CPU since the last pass (% of a core), RSS, USS (as last read)
        and state, as JSON."""
        if not workers:
            return None
        now, cur = self._wcpu.get(key), []
        for w, r in zip(workers, rss, strict=True):
            pct = None
            if before and now and now["t"] > before["t"] and w.pid in before["cpu"] \
                    and w.pid in now["cpu"]:
                pct = 100.0 * (now["cpu"][w.pid] - before["cpu"][w.pid]) / \
                    (now["t"] - before["t"])
            cur.append({"pid": w.pid, "cpu_pct": pct, "rss_mb": r,
                        "uss_mb": self._uss_each.get(key, {}).get(w.pid),
                        "status": self._stat.status(w.pid)})
        return json.dumps(cur)

    def _time_split(self, key: int | None, main: Any, workers: list[Any]) -> dict:
        """Run-queue wait and reads of the main process and its workers since the last pass
        (/proc schedstat and io), and the CPU of workers reaped in between: a worker that
        exits after its last sample (a short, non-persistent epoch) shows up only in its
        parent's children times, which hold its whole life; what the sampler already saw
        of it (its last schedstat on-CPU) is taken off."""
        now = time.monotonic()
        pids = [w.pid for w in workers]
        io = {p: procfs.io_counts(p, self.proc) for p in (main.pid, *pids)}
        self._io[key] = io  # (the sockets' look, _net_fields, reads them from here)
        cur = {"t": now, "pid": main.pid, "main": procfs.schedstat(main.pid, self.proc),
               "main_read": (io[main.pid] or (0, None))[1],  # what storage served
               "workers": {p: procfs.schedstat(p, self.proc) for p in pids},
               "reads": {p: (io[p] or (0, None))[1] for p in pids},
               "children": self._stat.now(main.pid).children_cpu_s}
        prev, self._prev[key] = self._prev.get(key), cur
        out: dict[str, float | None] = dict(proc_runq_pct=None, workers_runq_pct=None,
                                            workers_reaped_cpu_pct=None, proc_read_kb_s=None,
                                            workers_read_kb_s=None, proc_busy_threads=None,
                                            workers_busy_threads=None)
        if prev is None or now <= prev["t"] or prev.get("pid") != main.pid:
            # (a key whose process changed, a rank reported again from another process:
            # its counters are not this one's; a difference read -4,538% once)
            return out
        dt = now - prev["t"]
        a, b = prev["main"], cur["main"]
        if a is not None and b is not None:
            out["proc_runq_pct"] = 100.0 * b.runq_since(a) / 1e9 / dt
            out["proc_busy_threads"] = b.busy_threads_since(a, dt)
        both = [p for p in pids if cur["workers"].get(p) and prev["workers"].get(p)]
        if both:  # a worker's threads at work at once (one each, unless a pool runs)
            out["workers_busy_threads"] = sum(cur["workers"][p].busy_threads_since(
                prev["workers"][p], dt) for p in both) / len(both)
        if cur["main"] is not None:  # schedstat works here: workers are measured too
            out["workers_runq_pct"] = 100.0 * sum(
                cur["workers"][p].runq_since(prev["workers"][p]) for p in both) / 1e9 / dt
        if prev["main_read"] is not None and cur["main_read"] is not None:
            out["proc_read_kb_s"] = (cur["main_read"] - prev["main_read"]) / 1024 / dt
        reads = [p for p in pids if cur["reads"].get(p) is not None
                 and prev["reads"].get(p) is not None]
        if cur["main_read"] is not None:
            out["workers_read_kb_s"] = sum(
                cur["reads"][p] - prev["reads"][p] for p in reads) / 1024 / dt
        if prev["children"] is not None and cur["children"] is not None:
            gone = [s for p, s in prev["workers"].items() if p not in cur["workers"] and s]
            unseen = cur["children"] - prev["children"] - sum(s.on_cpu_ns for s in gone) / 1e9
            out["workers_reaped_cpu_pct"] = 100.0 * max(0.0, unseen) / dt
        return out

    def sample_all(self) -> list[HostSample]:
        """One row per rank of the followed job (or one for the followed process), each
        with the host's fields."""
        ps = self.psutil
        with self._lock:
            per_core = _safe(lambda: ps.cpu_percent(percpu=True))
            cores = [round(c, 1) for c in per_core or ()]
            vm = _safe(ps.virtual_memory)
            host = dict(
                ts=self.clock(), run_id=self._run_id,
                cpu_total_pct=sum(per_core) / len(per_core) if per_core else None,
                cpu_per_core=json.dumps(cores) if cores else None,
                **core_figures(cores),
                mem_used_mb=vm.used / MB if vm else None,
                mem_total_mb=vm.total / MB if vm else None,
                mem_available_mb=vm.available / MB if vm else None,
                shm_used_mb=_safe(lambda: shutil.disk_usage(self.shm_path).used / MB))
            rows, live = [], set()
            for rank, pid in self._targets() or [(None, None)]:
                main, workers = self._tree(pid) if pid is not None else (None, [])
                live |= {pid, *(w.pid for w in workers)}
                fields = self._process_fields(rank, main, workers,
                                              100.0 * len(per_core) if per_core else None)
                rows.append(HostSample(**{**_EMPTY, **host, **fields, "rank": rank}))
            self._procs = {p: o for p, o in self._procs.items() if p in live}
            self._stat.end_pass(live)
            self._limits = {p: v for p, v in self._limits.items() if p in live}
            mine = self._ours.cpu_pct(self._passes, live)
            if mine is not None:
                rows = [dataclasses.replace(r, monitor_cpu_pct=mine) for r in rows]
            own = next((p for _, p in self._targets()), None)
            groups = self._scan.sample({*live, *self._ours.pids, os.getpid()}, own) \
                if own is not None else None
            if groups is not None:
                rows = [dataclasses.replace(r, others_groups=groups) for r in rows]
            self._passes += 1
            return rows

    def sample(self) -> HostSample:
        """The followed process's row (the first rank's, for a job)."""
        return self.sample_all()[0]


def core_figures(cores: list[float]) -> dict[str, float]:
    """The sample's busiest, median and idlest core (HostSample's three; none without a
    reading)."""
    if not cores:
        return {}
    return {"cpu_busiest_core_pct": max(cores), "cpu_idlest_core_pct": min(cores),
            "cpu_median_core_pct": statistics.median(cores)}


_EMPTY = dict.fromkeys((  # a process's fields, none measured
    "proc_cpu_pct proc_rss_mb workers workers_cpu_pct workers_rss_mb workers_uss_mb "
    "proc_runq_pct workers_runq_pct workers_reaped_cpu_pct proc_read_kb_s proc_busy_threads "
    "workers_busy_threads workers_read_kb_s workers_detail").split())
