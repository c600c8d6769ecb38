"""Background sweep/tune jobs for the page: one at a time per dashboard process, run in a
named daemon thread through the page's own session manager (so the live workload stops while
a job measures), cancellable, with progress readable from any browser session."""
from __future__ import annotations

import threading
from typing import Any

from monitor.config import LoaderConfig
from monitor.sweep import Runner, SweepState


class JobHolder:
    """Holds the current job; thread-safe."""

    def __init__(self, store: Any, collector: Any, manager: Any) -> None:
        self.store, self.collector, self.manager = store, collector, manager
        self._lock = threading.Lock()
        self.state: SweepState | None = None
        self._runner: Runner | None = None
        self._thread: threading.Thread | None = None

    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def start_sweep(self, configs: list[LoaderConfig], seconds: float) -> SweepState:
        state = SweepState("sweep", len(configs))
        return self._start(state, seconds, lambda r: r.sweep(configs, state))

    def start_tune(self, base: LoaderConfig, max_workers: int, seconds: float,
                   budget_s: float | None = None) -> SweepState:
        state = SweepState("tune", 0)
        return self._start(state, seconds,
                           lambda r: r.tune(base, max_workers, budget_s, state))

    def _start(self, state: SweepState, seconds: float, body: Any) -> SweepState:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("a sweep or tune is already running: stop it first")
            runner = Runner(self.store, self.collector, self.manager, seconds)
            self._runner, self.state = runner, state
            self._thread = threading.Thread(target=body, args=(runner,),
                                            name=f"starvation-{state.kind}", daemon=True)
            self._thread.start()
        return state

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel: the configuration being measured is stopped and recorded as cancelled."""
        with self._lock:
            runner, thread = self._runner, self._thread
        if runner is not None:
            runner.cancel.set()
        if thread is not None:
            thread.join(timeout)
