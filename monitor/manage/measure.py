"""A managed run without the UI: start, wait, stop, assess (the `measure` command, and each
configuration of a sweep or tune)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from monitor.assess import same_runs
from monitor.assess.stall import STALL_KINDS, active_stall
from monitor.assess.window import Assessment, Context, assess_run
from monitor.config import LoaderConfig
from monitor.frames import analysis
from monitor.manage.result import gpu_figures, result
from monitor.records import oom_counted
from monitor.store import FAILED, RUNNING, StoreError
from monitor.thresholds import QUIET_MIN_S, QUIET_STEPS, VERDICT_MIN_STEPS, stall_limit_s

if TYPE_CHECKING:
    from monitor.manage.session import SessionManager
    from monitor.store import Store

FIRST_BATCH_TIMEOUT_S = 120.0  # spawning, importing torch and a user's dataset factory
STEADY_QUIET_READ_S = 30.0  # the steps read to judge a typical step at the deadline
STALL_GRACE_S = 2.0  # the watchdog checks once a second and writes its event
# a window too short to judge (fewer than VERDICT_MIN_STEPS after the first batch: a slow
# loader on a box other jobs keep busy) is extended, at most this many times its length
# and JUDGE_EXTRA_MAX_S, rather than ending "no data"
JUDGE_EXTRA_X = 3.0
JUDGE_EXTRA_MAX_S = 30.0


class Lab(Protocol):
    """What a measurement needs (a Runtime has it): the store, a session manager to start
    and stop the workload, a collector to follow it, the machine's limits and memory budget."""

    store: Store
    manager: SessionManager
    collector: Any
    memory_budget_mb: float | None

    def context(self) -> Context: ...


@dataclass(frozen=True, slots=True)
class Measurement:
    run_id: int
    status: str
    error: str | None
    accelerator: str | None  # the accelerator's own description
    config: LoaderConfig
    assessment: Assessment | None
    gpu: int | None = None  # NVML index the workload ran on
    gpu_util_mean: float | None = None  # NVML utilization over the same window, 0..100
    gpu_util_cv: float | None = None
    cancelled: bool = False

    @property
    def summary(self) -> analysis.Summary:
        nan = float("nan")
        return self.assessment.summary if self.assessment is not None \
            else analysis.Summary(0, 0.0, nan, nan, nan, nan)

    def to_dict(self) -> dict[str, Any]:
        return result(self.run_id, self.status, self.assessment,
                      (self.gpu, self.gpu_util_mean, self.gpu_util_cv), self.error,
                      self.accelerator, self.config.to_dict())


HINTS = (  # (words in the error, what to do)
    ("killed by signal 9", "the kernel's OOM killer or another process killed it: check "
                           "`dmesg`, or lower num_workers / prefetch_factor / batch_size"),
    ("looks stuck", "a read in the dataset's __getitem__ never returned: check its storage "
                    "(a hung network mount?), or add a timeout to it"),
    ("killed by signal", "another process sent it that signal"),
)


def failure_line(error: str | None) -> str:
    """The error's first line and, where the cause is known, what to do about it (a killed
    worker's from the OOM kills the kernel counted: NOTE [who killed the worker] in
    monitor/probe/oom_count.py)."""
    first = (error or "unknown error").strip().splitlines()[0]
    kills = (oom_counted(first) or (None, False))[0]
    hint = (None if kills is None else "the kernel's OOM killer killed it: lower num_workers "
            "/ prefetch_factor / batch_size, or what the dataset holds" if kills else
            "not the OOM killer (it killed nothing meanwhile): another process sent it (a "
            "scheduler's preemption, a watchdog, a kill -9); the loader's settings are not "
            "the cause") or next((h for words, h in HINTS if words in first), None)
    return f"{first}. What to do: {hint}" if hint else first


def _wait_for_first_batch(rt: Lab, run_id: int, cancel: threading.Event | None) -> None:
    """The clock starts at the first batch: spawning and importing torch is not the loader.
    A loader stuck before its first batch ends the wait (the watchdog says so)."""
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S
    while not rt.manager.wait_for_steps(1, timeout=0.5) and time.monotonic() < deadline:
        if (cancel is not None and cancel.is_set()) or not rt.manager.is_alive():
            return
        if active_stall(rt.store.events(run_id, kinds=STALL_KINDS)):
            return


def _quiet(store: Store, run_id: int) -> tuple[float, float] | None:
    """(seconds since the run's last step, the stall limit its watchdog uses) when the loop
    looks stopped at the deadline (thresholds.QUIET_MIN_S, QUIET_STEPS); else None."""
    steps = store.steps(run_id, since=time.time() - STEADY_QUIET_READ_S)
    last = store.last_step_ts(run_id)
    if last is None:
        return None
    step = float((steps["wait_s"] + steps["compute_s"]).median()) if not steps.empty else None
    quiet = time.time() - last
    if quiet < max(QUIET_MIN_S, QUIET_STEPS * (step or 0.0)):
        return None
    return quiet, stall_limit_s(step)


def _await_stall(rt: Lab, run_id: int, cancel: threading.Event | None) -> str | None:
    """At the deadline, a loop that has gone quiet gets until its watchdog's limit to be
    named stuck (a hang in the first batches has no history to wait for): a run that stopped
    there must not end 'stopped, no data'. Returns the stall, or None when batches came."""
    q = _quiet(rt.store, run_id)
    if q is None:
        return None
    deadline = time.monotonic() + max(0.0, q[1] - q[0]) + STALL_GRACE_S
    last = rt.store.last_step_ts(run_id)
    while time.monotonic() < deadline and rt.manager.is_alive():
        if cancel is not None and cancel.is_set():
            return None
        stall = active_stall(rt.store.events(run_id, kinds=STALL_KINDS))
        if stall:
            return stall
        if rt.store.last_step_ts(run_id) != last:
            return None  # batches again: it was slow, not stuck
        (cancel or threading.Event()).wait(0.2)
    return active_stall(rt.store.events(run_id, kinds=STALL_KINDS))


def _await_judgeable(rt: Lab, run_id: int, seconds: float,
                     cancel: threading.Event | None) -> None:
    """Past the deadline, until the run has VERDICT_MIN_STEPS steps beyond its first batch
    (or JUDGE_EXTRA_X x `seconds`, at most JUDGE_EXTRA_MAX_S, more): a window of two steps
    names no cause. A loop gone quiet is the stall wait's business, not this one's."""
    deadline = time.monotonic() + min(JUDGE_EXTRA_MAX_S, JUDGE_EXTRA_X * seconds)
    while time.monotonic() < deadline and rt.manager.is_alive():
        if cancel is not None and cancel.is_set():
            return
        if rt.manager.wait_for_steps(VERDICT_MIN_STEPS + 1, timeout=0.5):
            return
        if _quiet(rt.store, run_id) is not None or \
                active_stall(rt.store.events(run_id, kinds=STALL_KINDS)):
            return


def _wait(rt: Lab, seconds: float, cancel: threading.Event | None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and rt.manager.is_alive():
        if cancel is not None and cancel.is_set():
            return
        (cancel or threading.Event()).wait(min(0.1, max(0.0, deadline - time.monotonic())))


def measure(rt: Lab, config: LoaderConfig, seconds: float, name: str | None = None,
            parts: int = 1, cancel: threading.Event | None = None) -> Measurement:
    """Run `config` for `seconds` after its first batch (longer, within limits, until it has
    steps enough to judge: _await_judgeable), stop it (NOTE [shutdown protocol]
    in monitor/manage/runtime.py, 1), and assess the run's steady state cut into `parts`. The run
    stays in the store; `cancel` ends it early (the result says so)."""
    run_id = rt.manager.start(config, name=name)
    stall = None
    try:
        _wait_for_first_batch(rt, run_id, cancel)
        if not active_stall(rt.store.events(run_id, kinds=STALL_KINDS)):
            _wait(rt, seconds, cancel)
            _await_judgeable(rt, run_id, seconds, cancel)
        stall = active_stall(rt.store.events(run_id, kinds=STALL_KINDS)) or \
            _await_stall(rt, run_id, cancel)
        if stall:  # a stuck loader fails the run; measure still ends at its deadline
            rt.store.finish_run(run_id, FAILED, f"{stall} (measure stopped it)")
    finally:
        rt.manager.stop(stuck=bool(stall))
        rt.collector.follow(None, None)
    rt.store.check()
    if (rt.store.run(run_id) or {}).get("status") == RUNNING:  # its end could not be saved
        raise StoreError(rt.manager.last_error or f"run {run_id} ended but the store "
                         f"{rt.store.path} could not record it")
    cancelled = cancel is not None and cancel.is_set()
    m = summarise(rt.store, run_id, config, rt.context(), parts, cancelled)
    if not cancelled:  # kept for a later identical run (NOTE [identical runs])
        same_runs.remember(rt.store, run_id, m.assessment)
    return m


def summarise(store: Store, run_id: int, config: LoaderConfig, ctx: Context, parts: int = 1,
              cancelled: bool = False) -> Measurement:
    """The Measurement of a stored run: its steady-state assessment and NVML's utilization
    over the same window (what `measure --json` prints)."""
    run = store.run(run_id) or {}
    a = assess_run(store, run_id, ctx, parts)
    dev, mean, cv = gpu_figures(store, run, a)
    return Measurement(run_id=run_id, status=run.get("status", "unknown"),
                       error=run.get("error"), accelerator=run.get("accelerator"),
                       config=config, assessment=a, gpu=dev, gpu_util_mean=mean,
                       gpu_util_cv=cv, cancelled=cancelled)
