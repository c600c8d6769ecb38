"""Host sampling through psutil: CPU per core, memory, /dev/shm, and the workload's process
tree (its DataLoader workers are its children).

The psutil module, the shm path and the clock are injected with real defaults (DESIGN.md
style rule 4), so tests can point the sampler at a stand-in.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil as _psutil

from monitor.records import HostSample

MB = 1024 * 1024


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
        psutil.cpu_percent(percpu=True)  # prime: the first call has nothing to compare with

    def watch(self, pid: int | None, run_id: int | None) -> None:
        with self._lock:
            self._pid, self._run_id = pid, run_id
            self._procs = {}

    def _proc(self, pid: int) -> Any:
        p = self._procs.get(pid)
        if p is None:
            p = self.psutil.Process(pid)
            p.cpu_percent(None)
            self._procs[pid] = p
        return p

    def _tree(self) -> tuple[Any | None, list[Any]]:
        if self._pid is None:
            return None, []
        try:
            main = self._proc(self._pid)
            kids = main.children(recursive=True)
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
            )
