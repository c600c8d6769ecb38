"""Background sweep/tune jobs for the page: one at a time per dashboard process, run in a
named daemon thread through the page's own Lab (so the live workload stops while a job
measures), cancellable, with progress readable from any browser session."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from monitor.config import LoaderConfig
from monitor.tuning.search import SweepState

if TYPE_CHECKING:
    from monitor.manage.experiment import Experiments
    from monitor.manage.measure import Lab


class JobHolder:
    """Holds the current job; thread-safe."""

    def __init__(self, rt: Lab) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self.state: SweepState | None = None
        self._experiments: Experiments | None = None
        self._thread: threading.Thread | None = None

    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def start_sweep(self, configs: list[LoaderConfig], seconds: float) -> SweepState:
        state = SweepState("sweep", len(configs))
        return self._start(state, seconds, lambda e: e.sweep(configs, state))

    def start_tune(self, base: LoaderConfig, max_workers: int, seconds: float,
                   budget_s: float | None = None) -> SweepState:
        state = SweepState("tune", 0)
        return self._start(state, seconds, lambda e: e.tune(base, max_workers, budget_s, state))

    def _start(self, state: SweepState, seconds: float,
               body: Callable[[Experiments], object]) -> SweepState:
        from monitor.manage.experiment import Experiments

        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("a sweep or tune is already running: stop it first")
            exp = Experiments(self.rt, seconds)
            self._experiments, self.state = exp, state
            self._thread = threading.Thread(target=body, args=(exp,),
                                            name=f"starvation-{state.kind}", daemon=True)
            self._thread.start()
        return state

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel: the configuration being measured is stopped and recorded as cancelled
        (NOTE [shutdown protocol] in monitor/manage/runtime.py, 6)."""
        with self._lock:
            exp, thread = self._experiments, self._thread
        if exp is not None:
            exp.cancel.set()
        if thread is not None:
            thread.join(timeout)
