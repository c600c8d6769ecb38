"""The collector in a process of its own (`python -m monitor.sampling.collector`), driven
through the store: the dashboard's sampler (monitor/sampling/collector.py says why)."""
from __future__ import annotations

import json
import os
import subprocess

from monitor.manage import spawn
from monitor.store import Store

FOLLOW_KEY = "collector_follow:{owner}"  # meta key: [pid, run_id] the process follows


class CollectorProcess:
    """A Collector in its own process, driven through the store; the same calls as
    Collector for the Runtime (start, follow, stop)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.key = FOLLOW_KEY.format(owner=os.getpid())
        self._proc: subprocess.Popen | None = None

    def start(self) -> CollectorProcess:
        if self._proc is None or self._proc.poll() is not None:
            self.store.set_meta(self.key, json.dumps([None, None]))
            self._proc = spawn.start("monitor.sampling.collector", "--db",
                                     str(self.store.path), "--key", self.key,
                                     "--parent-pid", str(os.getpid()))
        return self

    def follow(self, pid: int | None, run_id: int | None) -> None:
        self.store.set_meta(self.key, json.dumps([pid, run_id]))

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM: the process flushes and exits (NOTE [shutdown protocol] in
        monitor/manage/runtime.py, 6); SIGKILL if it does not."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
