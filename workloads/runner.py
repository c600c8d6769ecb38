"""Entry point of the workload process (started by monitor/manage/session.py in a fresh
interpreter). How it ends is NOTE [shutdown protocol] in monitor/manage/runtime.py, points 1 to 5;
`main` and `ManagedWorkload.run` are its workload half.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader

from monitor import control
from monitor.config import USER_STEP_TIME_MS, ConfigError, LoaderConfig, describe_change
from monitor.presets import calibrated_step_ms
from monitor.probe import oom_count
from monitor.probe.timing import Probe
from monitor.probe.watchdog import Watchdog
from monitor.probe.workers import error_text
from monitor.records import LOADER_ERROR
from monitor.store import Store, StoreError, explain
from monitor.thresholds import CALIBRATION_NOISE, CALIBRATION_REUSE_S, PROVEN_STEPS
from workloads.accelerator import SimulatedAccelerator, UserStep, make_accelerator
from workloads.synthetic import PRESET_SPECS, make_dataset, worker_init
from workloads.user import GuardedDataset, Workload, WorkloadError, load, pickling_problem

MAX_ERROR_CHARS = 4000


def _sigterm(signum: int, frame: Any) -> None:
    # NOTE [shutdown protocol] in monitor/manage/runtime.py, 3
    raise SystemExit("terminated by the session manager (SIGTERM)")


def format_error(exc: BaseException, oom_kills: tuple[int | None, int | None] | None = None
                 ) -> str:
    """'ValueError: message' plus the tail of the traceback (the worker's, when torch
    re-raised a worker's exception, is inside the message). A WorkloadError's message is
    already written for the user and stands alone, and so is a DataLoader worker's death:
    torch's words in one line, with the OOM kills the kernel counted since `oom_kills` (NOTE
    [who killed the worker] in monitor/probe/oom_count.py), no traceback of wherever torch's
    SIGCHLD handler happened to raise it."""
    if isinstance(exc, WorkloadError):  # (from a worker, torch's re-raise wraps the words
        # written for the user in its own traceback: theirs are the last WorkloadError's)
        text = f"{exc}"
        mine = text.rfind("WorkloadError: ") if text.startswith("Caught ") else -1
        return (text[mine + len("WorkloadError: "):] if mine >= 0 else text)[:MAX_ERROR_CHARS]
    cut = isinstance(exc, (ConnectionResetError, EOFError, BrokenPipeError))
    # (a worker killed while the main process read its queue: torch's own "worker (pid N) is
    # killed" message loses that race)
    said = "a DataLoader worker died mid-transfer (killed?): " if cut else ""
    if oom_count.DEATH.search(one := error_text(exc)):
        return said + one + oom_count.note(oom_kills, one)
    head = f"{said}{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_exception(exc))
    room = MAX_ERROR_CHARS - len(head) - 2
    return (head + "\n\n" + tb[-room:]) if room > 0 else head[:MAX_ERROR_CHARS]


def calibrate(dataset: Any, n: int = 64, rounds: int = 3) -> float:
    """Seconds of loading per sample in this process (after two warm-up samples): the best
    of `rounds` rounds of n/rounds samples, each round the lesser of its wall time and this
    process's CPU time. Other load only ever adds wall time, and the time a sample waits for
    a CPU is not its cost: on a saturated box (a test suite, two busy loops and a browser on
    2 cores) the wall-clock calibration once read 25x the sample's cost and gave the
    starving demo a 1.3 s step (2 steps in a KPI window, no verdict). The CPU time of a
    sample whose transforms use several threads exceeds its wall time on an idle box: the
    lesser of the two is its cost either way (the calibrated presets do CPU work only)."""
    size = len(dataset)
    for i in range(2):
        dataset[i % size]
    per = max(1, n // rounds)
    best = math.inf
    for r in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        for i in range(per):
            dataset[(7919 * (r * per + i)) % size]
        took = min(time.perf_counter() - t, time.process_time() - c)
        best = min(best, took / per)
    return best


def checked_calibration(stored: float | None, fresh: float,
                        age_s: float | None = None) -> tuple[float, bool]:
    """The per-sample cost a run uses, and whether it replaces the stored one. A figure
    measured in the last CALIBRATION_REUSE_S stands (the runs of one session meet the same
    device, whatever the box's load does meanwhile); an older one is checked against the
    fresh measurement and replaced when they differ beyond CALIBRATION_NOISE, so no figure
    from another hour's load, or another machine, is kept."""
    if stored is None or stored <= 0:
        return fresh, True
    if age_s is not None and age_s <= CALIBRATION_REUSE_S:
        return stored, False
    if abs(fresh / stored - 1) <= CALIBRATION_NOISE:
        return stored, False
    return fresh, True


def shutdown_iterator(it: Any, stuck: bool = False) -> None:
    """Stop a DataLoader iterator's worker processes now rather than at garbage collection.
    `stuck`: the watchdog found the loader stuck, so its workers may never read the shutdown
    signal; they are terminated first (torch would wait MP_STATUS_CHECK_INTERVAL, 5 s, for
    each before terminating it)."""
    if stuck:
        for w in getattr(it, "_workers", None) or ():
            with contextlib.suppress(Exception):
                if w.is_alive():
                    w.terminate()
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


class ManagedWorkload:
    """Runs one managed workload: loader -> accelerator step, reconfigured through control."""

    def __init__(self, store: Store, run_id: int, config: LoaderConfig, parent_pid: int) -> None:
        self.store = store
        self.run_id = run_id
        self.config = config
        self.parent_pid = parent_pid
        self.user: Workload | None = None
        self.sample_cost_s: float | None = None
        if config.workload:
            self.user = load(config.workload)
            ds = self.user.dataset
            self.dataset = ds if self.user.iterable else GuardedDataset(ds)
            self.spec = None
            channels = 3
        else:
            self.spec = PRESET_SPECS[config.preset]
            self.dataset = make_dataset(config.preset)
            channels = self.spec.shape[0]
        if self.user is not None and self.user.model_step is not None:
            self.accel = UserStep(self.user.model_step)
        else:
            self.accel = make_accelerator(self._step_time(config), config.model_size, channels)
            if self.user is not None and not isinstance(self.accel, SimulatedAccelerator):
                # their batches are not our conv net's images: simulate the device instead
                self.accel = SimulatedAccelerator(self._step_time(config))
        self.probe = Probe(store, run_id)
        self.watchdog = Watchdog(self.probe)  # reports a stuck loader; never stops it
        self.loader: DataLoader | None = None
        self.pending: LoaderConfig | None = None
        self.pending_id = 0
        self.pending_source: str | None = None  # "autotune: why" when the autotuner asked
        self.stop_reason: str | None = None
        self.good: LoaderConfig | None = None  # the last settings that ran PROVEN_STEPS
        self.applied_id = 0  # the request that brought the settings in force
        self.steps_in_config = 0

    def _step_time(self, cfg: LoaderConfig) -> float:
        if cfg.step_time_ms is not None:
            return cfg.step_time_ms
        if self.spec is None:
            return USER_STEP_TIME_MS
        if self.spec.step_ratio is not None:
            if self.sample_cost_s is None:  # measured at each run's start, checked (above)
                key = f"sample_cost_s:{cfg.preset}"
                stored, age = self.store.calibration_with_age(key)
                self.sample_cost_s, replace = checked_calibration(
                    stored, calibrate(self.dataset), age)
                if replace:
                    self.store.set_calibration(key, self.sample_cost_s)
            return calibrated_step_ms(cfg.preset, self.sample_cost_s, cfg.batch_size) or 0.0
        return self.spec.step_time_ms

    def _build_loader(self) -> DataLoader:
        kw = self.config.loader_kwargs()
        if self.user is None:
            self.dataset.length = self.config.epoch_samples
            if self.config.num_workers > 0:
                kw["worker_init_fn"] = worker_init
            return DataLoader(self.dataset, shuffle=True, drop_last=True, **kw)
        u = self.user
        if self.config.num_workers > 0:
            ctx = u.multiprocessing_context or mp.get_start_method()
            problem = pickling_problem(u, ctx if isinstance(ctx, str) else ctx.get_start_method())
            if problem:
                raise WorkloadError(problem)
            if u.multiprocessing_context is not None:
                kw["multiprocessing_context"] = u.multiprocessing_context
        if not u.iterable and len(self.dataset) == 0:
            raise WorkloadError(f"{u.spec}: the dataset is empty (len() is 0)")
        return DataLoader(self.dataset, shuffle=not u.iterable, collate_fn=u.collate_fn, **kw)

    def _close_loader(self, stuck: bool = False) -> None:
        shutdown_iterator(self.probe.current_iterator, stuck)
        if self.loader is not None:  # persistent workers
            shutdown_iterator(getattr(self.loader, "_iterator", None), stuck)
        self.probe.current_iterator = None
        self.loader = None

    def _between_steps(self) -> bool:
        """Control and parent checks in the gap between steps; True ends the epoch."""
        self.steps_in_config += 1
        if self.steps_in_config == PROVEN_STEPS:
            self.good = self.config
        if not self.probe.control_due():
            return False
        if os.getppid() != self.parent_pid:  # NOTE [shutdown protocol], 2
            self.stop_reason = "the process that started the workload exited"
            return True
        for cid, kind, payload in self.probe.poll_control():
            if kind == control.STOP:  # NOTE [shutdown protocol], 1
                self.stop_reason = "stopped on request"
                self.store.mark_control(cid, control.ok())
                return True
            if kind == control.CONFIG:
                settings, source, _ = control.split(payload)
                try:
                    new = LoaderConfig.from_dict(settings)
                    if new.preset != self.config.preset:
                        raise ConfigError("a preset change starts a new run (session manager)")
                except (ConfigError, TypeError) as exc:
                    self.store.mark_control(cid, control.refused(exc))
                    continue
                if self.pending is not None:  # a newer request replaces it unapplied
                    self.store.mark_control(self.pending_id, control.superseded(cid))
                self.pending = new
                self.pending_id = cid
                self.pending_source = source
        return self.pending is not None and self._needs_rebuild(self.pending)

    def _needs_rebuild(self, new: LoaderConfig) -> bool:
        old = self.config
        if old.loader_kwargs() == new.loader_kwargs():
            self._apply(new)  # accelerator-only change: no new loader
            return False
        return True

    def _apply(self, new: LoaderConfig) -> None:
        label = control.change_label(describe_change(self.config, new), self.pending_source)
        self.accel.configure(self._step_time(new), new.model_size)
        self.config = new
        self.probe.config_seq += 1
        self.store.add_event(self.run_id, control.CONFIG, label, new.to_dict())
        self.store.update_run(self.run_id, config=new.to_dict())
        self.store.mark_control(self.pending_id, control.ok())
        self.applied_id, self.steps_in_config = self.pending_id, 0
        self.pending = None

    def _revert(self, exc: BaseException) -> bool:
        """A loader that failed under settings newer than the last good ones (a worker
        killed, out of memory): back to those, the move marked failed; the run goes on.
        False when there is nothing to go back to (the failure is the run's)."""
        good = self.good
        if good is None or good == self.config or self.stop_reason is not None:
            return False
        why = format_error(exc).strip().splitlines()[0]
        with contextlib.suppress(Exception):
            self._close_loader()
        label = f"{describe_change(self.config, good)}: the move failed ({why}); back to " \
                "the last good settings"
        self.accel.configure(self._step_time(good), good.model_size)
        self.config = good
        self.probe.config_seq += 1
        self.steps_in_config = 0
        self.store.add_event(self.run_id, control.CONFIG, label,
                             {**good.to_dict(), "failed": why})
        self.store.update_run(self.run_id, config=good.to_dict())
        if self.applied_id:
            self.store.mark_control(self.applied_id, control.failed(why))
        self.store.set_meta(control.reverted_key(self.run_id), str(self.probe.config_seq))
        print(f"starvation-monitor workload: {label}", file=sys.stderr, flush=True)
        self.loader = self._build_loader()
        return True

    def run(self) -> str:
        """Train until stopped; returns the stop reason."""
        torch.manual_seed(0)
        self.store.update_run(self.run_id, accelerator=self.accel.description, pid=os.getpid(),
                              accelerator_kind=self.accel.kind,
                              device=self.accel.device_info())
        self.store.add_event(self.run_id, control.CONFIG, "start", self.config.to_dict())
        epoch = 0
        self.watchdog.start()
        try:
            self.loader = self._build_loader()
            while self.stop_reason is None:
                # One pass = one epoch; it ends early for a stop or a loader rebuild.
                try:
                    for batch in self.probe.iterate(self.loader, epoch, self._between_steps):
                        self.probe.copy_s = self.accel.step(batch)
                except Exception as exc:  # a move's loader failed: back to the last good
                    if not self._revert(exc):
                        raise
                epoch += 1
                if self.stop_reason is None and self.pending is not None:
                    self._close_loader()
                    self._apply(self.pending)
                    self.loader = self._build_loader()
        finally:
            stuck = self.watchdog.stalled  # (stop() closes the stall)
            self.watchdog.stop()
            self._close_loader(stuck)
            self.probe.flush_final()
            self._close_requests()
        return self.stop_reason or "stopped"

    def _close_requests(self) -> None:
        """Requests the run will never apply are marked, not left waiting."""
        with contextlib.suppress(Exception):
            if self.pending is not None:
                self.store.mark_control(self.pending_id, control.ENDED_FIRST)
            for cid, _, _ in self.store.pending_control(self.run_id):
                self.store.mark_control(cid, control.ENDED_FIRST)


def main(store_path: str, run_id: int, config: dict[str, Any], parent_pid: int) -> None:
    """Process entry: run, then record how the run ended (NOTE [shutdown protocol] in
    monitor/manage/runtime.py, 1-4)."""
    signal.signal(signal.SIGTERM, _sigterm)
    # More workers than cores is a setting we measure (io-bound loaders gain from it) and
    # diagnose (oversubscribed), not one to warn about on every loader rebuild.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    try:
        store = Store(store_path)
    except StoreError as exc:
        print(f"starvation-monitor workload: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    oom_kills = oom_count.read()  # the kernel's count as the run begins
    try:
        cfg = LoaderConfig.from_dict(config)
        if os.environ.get("STARVATION_MONITOR_TORCH_THREADS", "1") != "0":
            # The simulated accelerator leaves the host idle; one intra-op thread keeps a
            # num_workers=0 loader from borrowing every core, as it would beside a busy GPU.
            torch.set_num_threads(1)
        reason = ManagedWorkload(store, run_id, cfg, parent_pid).run()
        _finish(store, run_id, "stopped", None if reason == "stopped on request" else reason)
    except (SystemExit, KeyboardInterrupt) as exc:
        code = getattr(exc, "code", None) or "interrupted (SIGINT)"
        _finish(store, run_id, "stopped", str(code))
    except BaseException as exc:
        text = str(exc) if isinstance(exc, StoreError) else format_error(exc, oom_kills)
        if isinstance(exc, StoreError):
            print(f"starvation-monitor workload: {exc}", file=sys.stderr)
        elif oom_count.DEATH.search(text):  # the assessment names it, as an attached run's
            with contextlib.suppress(Exception):
                store.add_event(run_id, LOADER_ERROR, text, {"error": text})
        _finish(store, run_id, "failed", text)
        raise SystemExit(1) from None
    finally:
        store.close()


def _finish(store: Store, run_id: int, status: str, error: str | None) -> None:
    """Record how the run ended where the store can still be written; else say so."""
    try:
        store.finish_run(run_id, status, error)
    except Exception as exc:
        print(f"starvation-monitor workload: could not record that run {run_id} ended "
              f"({status}): {explain(store.path, exc)}", file=sys.stderr)


def cli(argv: list[str] | None = None) -> None:
    """`python -m workloads.runner --db PATH --run-id N --config JSON --parent-pid PID`,
    as the session manager starts it."""
    p = argparse.ArgumentParser(prog="python -m workloads.runner")
    p.add_argument("--db", required=True)
    p.add_argument("--run-id", type=int, required=True)
    p.add_argument("--config", required=True, help="LoaderConfig as JSON")
    p.add_argument("--parent-pid", type=int, required=True)
    a = p.parse_args(argv)
    main(a.db, a.run_id, json.loads(a.config), a.parent_pid)


if __name__ == "__main__":
    cli(sys.argv[1:])
