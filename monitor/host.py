"""Host sampling through psutil: CPU per core, memory, /dev/shm, and the workload's process
tree (its DataLoader workers are its children).

The psutil module, the shm path and the clock are injected with real defaults (DESIGN.md
style rule 4), so tests can point the sampler at a stand-in.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil as _psutil

from monitor.records import CpuBudget, HostSample

MB = 1024 * 1024
USS_EVERY = 8
TREE_EVERY = 4  # passes between scans for the followed process's descendants


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _stat_fields(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs granted by the cgroup's CPU quota (v2 cpu.max, else v1), or None when unlimited."""
    v2 = _read(os.path.join(root, "cpu.max"))
    if v2 is not None:
        try:
            quota, period = v2.split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except ValueError:
            return None
    q = _read(os.path.join(root, "cpu", "cpu.cfs_quota_us"))
    p = _read(os.path.join(root, "cpu", "cpu.cfs_period_us"))
    try:
        quota_us, period_us = int(q or ""), int(p or "")
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def cpu_budget(root: str = "/sys/fs/cgroup", affinity: int | None = None) -> CpuBudget:
    """Affinity, cgroup quota and throttling (v2 cpu.stat, else v1 cpu/cpu.stat)."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    usable = max(1, min(affinity, int(quota + 0.999)) if quota is not None else affinity)
    stat = _stat_fields(_read(os.path.join(root, "cpu.stat")))
    throttled_s = stat["throttled_usec"] / 1e6 if "throttled_usec" in stat else None
    if not stat:
        stat = _stat_fields(_read(os.path.join(root, "cpu", "cpu.stat")))
        if "throttled_time" in stat:
            throttled_s = stat["throttled_time"] / 1e9
    periods, thr = stat.get("nr_periods"), stat.get("nr_throttled")
    throttled = thr / periods if periods and thr is not None else None
    return CpuBudget(affinity, quota, usable, throttled, throttled_s)


def usable_cores(root: str = "/sys/fs/cgroup") -> int:
    return cpu_budget(root).usable


def _safe(fn: Callable[[], Any], default: Any = None) -> Any:
    """One read, with 'gone' or 'not permitted' turned into a missing value."""
    try:
        return fn()
    except (_psutil.Error, OSError, ValueError):
        return default


class HostSampler:
    """Samples the host and the watched process tree; `sample()` returns a HostSample."""

    def __init__(
        self,
        psutil: ModuleType = _psutil,
        shm_path: str = "/dev/shm",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.psutil = psutil
        self.shm_path = shm_path
        self.clock = clock
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._run_id: int | None = None
        self._procs: dict[int, Any] = {}  # cpu_percent needs the same object between calls
        self._kids: list[Any] | None = None  # descendants, refreshed one pass in TREE_EVERY
        self._passes = 0
        self._uss: float | None = None
        psutil.cpu_percent(percpu=True)  # prime: the first call has nothing to compare with

    def follow(self, pid: int | None, run_id: int | None) -> None:
        with self._lock:
            self._pid, self._run_id = pid, run_id
            self._procs = {}
            self._kids = None
            self._passes, self._uss = 0, None

    def _proc(self, pid: int) -> Any:
        p = self._procs.get(pid)
        if p is None:
            p = self.psutil.Process(pid)
            p.cpu_percent(None)
            self._procs[pid] = p
        return p

    def _tree(self) -> tuple[Any | None, list[Any]]:
        """The followed process and its descendants. Finding descendants scans every process
        on the host (psutil reads /proc for each), costly beside a browser's dozens: so the
        list is refreshed one pass in TREE_EVERY, and between refreshes dead ones drop out."""
        if self._pid is None:
            return None, []
        try:
            main = self._proc(self._pid)
            if self._passes % TREE_EVERY == 0 or self._kids is None:
                self._kids = main.children(recursive=True)
            kids = [k for k in self._kids if k.is_running()]
        except (_psutil.Error, OSError):
            return None, []
        workers = []
        for k in kids:
            try:
                workers.append(self._proc(k.pid))
            except (_psutil.Error, OSError):
                pass
        live = {self._pid, *(w.pid for w in workers)}
        self._procs = {pid: p for pid, p in self._procs.items() if pid in live}
        return main, workers

    def sample(self) -> HostSample:
        ps = self.psutil
        with self._lock:
            per_core = _safe(lambda: ps.cpu_percent(percpu=True))
            vm = _safe(ps.virtual_memory)
            shm = _safe(lambda: shutil.disk_usage(self.shm_path).used / MB)
            main, workers = self._tree()
            proc_cpu = _safe(lambda: main.cpu_percent(None)) if main else None
            proc_rss = _safe(lambda: main.memory_info().rss / MB) if main else None
            w_cpu = [_safe(lambda w=w: w.cpu_percent(None)) for w in workers]
            w_rss = [_safe(lambda w=w: w.memory_info().rss / MB) for w in workers]
            if self._passes % USS_EVERY == 0:  # USS reads smaps: costly, so 1 pass in 8
                uss = [_safe(lambda w=w: w.memory_full_info().uss / MB) for w in workers]
                self._uss = sum(u for u in uss if u is not None) if main else None
            self._passes += 1
            return HostSample(
                ts=self.clock(),
                run_id=self._run_id,
                cpu_total_pct=sum(per_core) / len(per_core) if per_core else None,
                cpu_per_core=json.dumps([round(c, 1) for c in per_core]) if per_core else None,
                mem_used_mb=vm.used / MB if vm else None,
                mem_total_mb=vm.total / MB if vm else None,
                mem_available_mb=vm.available / MB if vm else None,
                shm_used_mb=shm,
                proc_cpu_pct=proc_cpu,
                proc_rss_mb=proc_rss,
                workers=len(workers) if main else None,
                workers_cpu_pct=sum(c for c in w_cpu if c is not None) if main else None,
                workers_rss_mb=sum(r for r in w_rss if r is not None) if main else None,
                workers_uss_mb=self._uss if main else None,
            )
