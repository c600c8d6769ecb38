"""The one composition root: a Store, a Collector, a SessionManager and the background jobs,
put together the same way for the dashboard, the CLI, measure, attached runs and the benches
(NOTE [shutdown protocol] below)."""

# NOTE [shutdown protocol]
# The one place that says how things end. Functions that take part cite it.
#   Workload process (workloads/runner.py):
#   1. Stop request: SessionManager.stop writes a `stop` control row; the workload polls
#      control between steps (every 0.25 s), shuts its DataLoader workers down, flushes, marks
#      the run `stopped` and exits 0.
#   2. Parent gone: the workload watches its parent's PID (the fork server that forked it, or
#      the manager that spawned it); when it changes it stops as in 1, with the reason. The
#      fork server ends when the manager closes its stdin or dies (workloads/forkserver.py),
#      so a dead manager's workload stops either way.
#   3. SIGTERM: turned into SystemExit in the workload, so the same `finally` shuts workers
#      down, flushes and marks the run `stopped`. The manager sends it when a stop request is
#      not honoured within its timeout (a step stuck in the dataset), then SIGKILL.
#   4. Errors: any exception marks the run `failed` with the error text; workers are still
#      shut down. Exit code 1.
#   5. SIGKILL of the workload: nothing runs there. Its DataLoader workers see their parent
#      gone and exit; the manager's reaper marks the run failed with the exit status and
#      kills any remembered child still alive (session.py `_kill_tree`).
#   The first writer of a run's final status wins (Store.finish_run): 4 and 5 never overwrite
#   each other.
#   Owners:
#   6. Runtime.close (CLI commands, benches, the dashboard at interpreter exit): stop the
#      follows of live runs and close their outputs (an attached run's are stopped by
#      `monitor run` once the script has ended and the relay stored its last steps), the
#      page's autotuners (they only request; the job keeps its last applied setting), cancel a
#      running sweep or tune (it owns the manager's workload), then close the manager
#      (1, then 3, then its fork server), then stop the collector (it flushes its last
#      samples).
#   7. The CLI turns SIGTERM into KeyboardInterrupt so 6 runs from its `finally`; exit 130.
#   8. Attached runs (`monitor run`): the script is not ours to stop. Signals sent to the
#      wrapper are forwarded to the script; the wrapper waits for it and ends the run with the
#      script's status; the probe in the script flushes at exit (atexit). The script and its
#      DataLoader workers die with the wrapper (NOTE [bound to monitor run] in
#      monitor/probe/lifeline.py): a SIGKILL of the wrapper or its group leaves no orphan.
from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from monitor import control
from monitor.assess import outcomes
from monitor.assess.follow import Follow, Output
from monitor.assess.window import Context
from monitor.config import LoaderConfig, max_workers
from monitor.manage.collector_process import CollectorProcess
from monitor.manage.context import machine_context
from monitor.manage.jobs import JobHolder
from monitor.manage.session import SessionManager
from monitor.sampling.budget import usable_cores
from monitor.sampling.collector import Collector
from monitor.store import ATTACHED, RUNNING, Store
from monitor.tuning.live import Cadence, LiveTuner, window_s


class Runtime:
    """Owns the store, the collector thread, the session manager and the job holder.

    `start()` starts the collector; `close()` ends everything in the NOTE's order (6). Usable
    as a context manager."""

    def __init__(self, db: str | Path | None = None, config: LoaderConfig | None = None,
                 gpu: Any = None, memory_budget_mb: float | None = None,
                 store: Store | None = None, collector_process: bool = False) -> None:
        """`collector_process`: sample in a process of its own (the dashboard's choice, see
        monitor/sampling/collector.py); else in a thread here, where `gpu` may inject a backend."""
        self.store = store if store is not None else Store(db)
        self.collector: Collector | CollectorProcess = (
            CollectorProcess(self.store) if collector_process
            else Collector(self.store, gpu=gpu))
        self.manager = SessionManager(self.store, config, on_start=self.collector.follow)
        self.jobs = JobHolder(self)
        self.memory_budget_mb = memory_budget_mb
        self.max_workers = max_workers(usable_cores())
        self.workload: dict | None = None  # a user dataset named at launch, checked
        self.workload_error: str | None = None  # why that dataset could not be used
        self.metrics_server: Any = None
        self.metrics_error: str | None = None  # why /metrics could not be served
        self.autotunes: dict[int, LiveTuner] = {}  # the page's Auto-tune switches, by run
        self.follows: dict[int, Follow] = {}  # live runs' outputs (assess/follow.py), by run
        self._closed = False

    def start(self, orphans: bool = True) -> Runtime:
        """Close runs whose recording process is gone (`orphans`: an attached run's launcher
        did before its script started; a locked store leaves them for later), then start
        sampling."""
        self.orphans_closed = self.store.close_orphans(later_if_locked=True) if orphans \
            else []
        self.collector.start()
        atexit.register(self.close)
        return self

    def serve_metrics(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve /metrics (monitor/export/prometheus.py) until close(); ExporterError when
        the port cannot be had."""
        from monitor.export.prometheus import serve

        self.metrics_server = serve(str(self.store.path), self.context(), port, address)

    def follow(self, run_id: int, outputs: list[Output]) -> Follow:
        """Feed `outputs` (monitor/manage/outputs.py makes them from flags) the run's new rows
        and its assessed window until unfollow() or close()."""
        f = self.follows[run_id] = Follow(self.store, run_id, self.context,
                                          outputs).start()
        return f

    def unfollow(self, run_id: int) -> Follow | None:
        """Stop a run's follow and close its outputs (the run has ended)."""
        f = self.follows.pop(run_id, None)
        if f is not None:
            f.stop()
        return f

    def context(self) -> Context:
        """The machine's limits for an assessment, read now (cgroup throttling changes)."""
        return machine_context(self.memory_budget_mb, outcomes.scale_of(self.store))

    def autotune(self, run_id: int, on: bool) -> str | None:
        """The page's Auto-tune switch for a running run: the managed workload (through the
        session manager, measured in windows) or an attached script (through its control
        requests, measured per epoch). Returns why it cannot, else None."""
        tuner = self.autotunes.get(run_id)
        if not on:
            if tuner is not None:
                tuner.stop()
                self.store.add_event(run_id, control.AUTOTUNE, "auto-tune off", {})
            self.autotunes.pop(run_id, None)
            return None
        if tuner is not None and tuner.alive:
            return None
        run = self.store.run(run_id) or {}
        if run.get("status") != RUNNING:
            return f"run {run_id} is not running: auto-tune tunes a running job"
        if self.jobs.running():
            return "a sweep or tune owns the workload: stop it first"
        if run.get("kind") == ATTACHED:
            tuner = LiveTuner(self.store, run_id, self.context(), cadence=Cadence("epoch"))
        elif run_id == self.manager.run_id:
            def request(settings: dict[str, Any], source: str) -> int | None:
                return self.manager.reconfigure(self.manager.config.replace(**settings),
                                                source=source)
            tuner = LiveTuner(self.store, run_id, self.context(),
                              cadence=Cadence("window", seconds=window_s()), request=request)
        else:
            return f"run {run_id} belongs to another process: tune it there"
        self.autotunes[run_id] = tuner.start()
        return None

    def autotune_summary(self, run_id: int) -> dict[str, Any] | None:
        """The switch's state for the page: None when off, else the tuner's summary, with
        `running` (False once settled, ended or stopped by an error)."""
        tuner = self.autotunes.get(run_id)
        if tuner is None:
            return None
        return {**tuner.summary(), "running": tuner.alive, "unit": tuner.cadence.unit}

    def close(self) -> None:
        """NOTE [shutdown protocol] 6: autotuners and jobs, then the workload, then the
        collector."""
        if self._closed:
            return
        self._closed = True
        try:
            for run_id in list(self.follows):
                self.unfollow(run_id)
            for tuner in list(self.autotunes.values()):
                tuner.stop()
            self.jobs.stop()
            self.manager.close()
        finally:
            self.collector.stop()
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
                self.metrics_server.server_close()
            atexit.unregister(self.close)

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
