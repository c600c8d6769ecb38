"""One attached run's recorder in a user's process: its epochs, what it reports of the
loader and the rank, and the control requests it applies (monitor/control.py, the
protocol). The steps themselves go through a Probe and the one timing loop
(monitor/probe/timing.py), as in the managed workload.

At each epoch start it applies loader changes requested through the store's control table
(num_workers, prefetch_factor, pin_memory, persistent_workers) and records when (or, under
`--autotune-every-steps N`, at a step boundary: monitor/probe/epoch_plan.py); settings a
DataLoader fixes at construction (batch_size, sampler, ...) are refused with the reason.
"""
from __future__ import annotations

import atexit
import sys
import weakref
from collections.abc import Callable
from typing import Any

from monitor import control
from monitor.probe import lifeline, oom_count, untimed, workers
from monitor.probe.choice import LoaderChoice, grad_enabled
from monitor.probe.compiles import CompileWatch
from monitor.probe.identity import rank_identity
from monitor.probe.loaders import (
    base_loader,
    batch_size,
    held_iterator,
    loader_settings,
    shipped,
    worker_procs,
)
from monitor.probe.phases_attach import attach as attach_phases
from monitor.probe.requests import LoaderRequests
from monitor.probe.samples import sample_counter
from monitor.probe.timing import Probe, TimedIterator
from monitor.probe.watchdog import RELAY_GONE, Watchdog
from monitor.probe.writer import relay_ring
from monitor.records import (
    COMPILE,
    EPOCH,
    LOADER,
    LOADER_ERROR,
    PROBE,
    WORKERS_READY,
)
from monitor.store import Store

FLUSH_S, FLUSH_STEADY_S = 0.5, 2.0  # writes while young, then (NOTE [the writer's wake])


class Recorder(LoaderChoice, LoaderRequests):
    """One run's epochs and control in a user's process; the steps themselves go through a
    Probe (the same records and batching as the managed workload)."""

    def __init__(self, store: Store, run_id: int, script: str) -> None:
        self.store, self.run_id, self.script = store, run_id, script
        self.rank, self.local_rank, self.world_size = rank_identity()
        self.probe = Probe(store, run_id, flush_interval=FLUSH_S, rank=self.rank)
        self.probe.on_error = self._stop_recording
        self.probe.on_fault = lambda exc, where: self.fault(exc, where)
        self.probe.on_first_batch = self._loader_report
        self.probe.on_loader_error = self._loader_error
        self.probe.on_untimed_error = self._untimed_error
        self.probe.on_workers_ready = self._workers_ready
        self.pickled: dict[int, int | None] = {}  # id(dataset) -> its pickled bytes
        self.held: dict[int, tuple[int, str | None]] = {}  # id(dataset) -> held_bytes
        self.broken: set[int] = set()  # loaders no longer timed: the probe failed on them
        self.loader_cls: str | None = None
        self.fixed: str | None = None  # why the timed loader cannot be re-tuned live
        self.batch_filled = False
        self._timed: Callable[[], Any] = lambda: None  # the loader followed (a weak ref)
        self._timed_data: Callable[[], Any] = lambda: None  # ... its dataset (a weak ref)
        self._timed_kind: tuple[str, int | None] | None = None  # ... its class and length
        self.built, self.built_by = 0, None  # training loaders built again (choice.py)
        self.mode_in_step = False  # NOTE [the model's mode] in monitor/probe/choice.py
        self._starting: Any = None  # the epoch's loader until its first batch is reported
        self.standing: dict[str, Any] = {}  # settings changed live (requests.py)
        self.batchless = False  # ... batches in its dataset: its batch size filled at exit
        self.reported: dict[str, Any] = {}  # its settings as last reported
        self.worker_procs: list[Any] = []  # the timed epoch's workers (note_workers)
        self.loader_failed = False  # a loader error was recorded
        self.oom_kills = oom_count.read()  # the kernel's, as the run began (NOTE [who killed
        # the worker] in monitor/probe/oom_count.py)
        self.epoch = -1
        self.last_control = 0
        self.loader_id: int | None = None  # the loader timed (the training loader)
        self.loader_role: str | None = None  # how it was found (monitor/probe/loops.py)
        self.skipped: set[int] = set()  # loaders seen and not timed (said once each)
        self.loop_thread: int | None = None  # the training loop's, where not the main one
        self.trained = False  # an epoch of the timed loader ran with gradients on
        self.eval_passes = 0  # ... and the passes over it with them off (evaluation)
        self._open: Callable[[], TimedIterator | None] = lambda: None  # (a weak reference)
        self.let_go: int | None = None  # batches of the iterator the loop let go of, last
        self.stopped: str | None = None  # why recording stopped (the training goes on)
        self.said_no_midepoch = False
        self.closing = False  # at exit, past the last flush: events are written at once
        # called with the recorder at each timed epoch's start, never raising into the loop
        # (the notebook's live view registers one: monitor/notebook.py)
        self.epoch_hooks: list[Callable[[Recorder], None]] = []
        self.compiles = CompileWatch()  # torch.compile's graphs, looked at per epoch
        # the watchdog's thread writes the steps: the loop only appends
        self.probe.inline_flush = False
        self.probe.ring = relay_ring(self.probe, self._say)
        self.watchdog = Watchdog(self.probe, FLUSH_S, self._say, steady=FLUSH_STEADY_S,
                                 poke_fd=self.probe.ring and self.probe.ring.poke_fd)
        if self.probe.ring is not None and self.probe.ring.alive_fd is not None:
            self.watchdog.on_launcher_gone = lambda: self.closing or lifeline.end_with_launcher(
                self.probe)  # NOTE [bound to monitor run], 4
            lifeline.unbind()
        self.watchdog.start()
        self.phases_said: set[str] = set()
        self.probe.phases = attach_phases(self._say_phases)  # None with --no-phases
        if self.probe.phases is not None:  # next()'s modules are the loader's; the device
            # time per phase once CUDA is used
            self.probe.phases.source, self.probe.phases.device = self.probe, self.probe.device
        atexit.register(self.close)

    def flush(self) -> None:
        """Write the buffered steps; a failed write stops recording (Probe.on_error), never
        the user's training."""
        self.probe.flush()

    def look_at_compiles(self) -> None:
        """torch.compile's graphs new since the last look (monitor/probe/compiles.py), an
        event; at an epoch's start and at exit, never on the step's path."""
        try:
            data = self.compiles.look(self.probe.step)
            if data is not None:
                self._event(COMPILE, f"torch.compile: {data['new_graphs']} graph(s) compiled "
                            f"by step {data['step']}" + (
                                "; it hit its recompile_limit: new shapes run uncompiled"
                                if data["limit_hit"] else ""), data)
        except Exception:  # the compile figures are extra
            pass

    def close(self) -> None:
        """At exit: the last step of an epoch that was delivered whole is recorded (a loop
        that stops by length never asks again); a loop left mid-epoch drops its last."""
        self._starting = None
        it = self.open
        try:
            if it is not None:
                it.on_drop = None  # past this, a drop records nothing (NOTE [the loop let go])
            if it is not None and not it.ended and not it.passthrough and it.complete():
                it.finish()
            self.look_at_compiles()
            if not self.stopped:
                self._fill_batch_size(self._timed())
        except Exception as exc:  # at exit too: a sentence, never a traceback
            self.fault(exc, "at exit")
        try:  # a worker's death raised outside the loader (torch's SIGCHLD handler)
            if not self.loader_failed and (text := workers.killed_note(self.worker_procs)):
                self._loader_error(RuntimeError(text))
            self.watchdog.stop()
            ring = self.probe.ring  # `monitor run` gone, and its end not seen yet: here
            if ring is not None and ring.relay_gone() and self.probe.unrelay():
                self._say(RELAY_GONE)
            self.probe.flush_final()
        except Exception as exc:
            self.closing = True  # no writer after this one: its note is written now
            self.fault(exc, "writing the last steps at exit")

    # -- what the loader's batches meet (monitor/probe/workers.py) -----------------------
    def _loader_report(self, batch: Any, it: Any) -> None:
        """An epoch's first batch: its size, the workers and prefetch in flight, /dev/shm,
        the open-files limit, the sharing strategy and the start method, as a `loader`
        event (the causes in monitor/diagnosis/causes.py read it)."""
        loader = self._starting if self._starting is not None else self._timed()
        self._starting = None  # (never `a or b`: bool() calls a loader's len())
        base = base_loader(loader) if loader is not None else None
        figures = workers.report(base if base is not None else loader, batch)
        self._hook_held(loader, base)
        if self.probe.count_samples is None and batch is not None:  # how samples are counted
            self.probe.count_samples, self.probe.samples_from = sample_counter(
                batch, batch_size(base if base is not None else loader))
        if self.probe.samples_from is not None:
            figures["samples_from"] = self.probe.samples_from
        if (it := self.open) is not None:  # the epoch's start: iter(), then the first batch
            figures["iter_s"] = it.iter_s
            figures["first_batch_s"] = self.probe.clock() - it.t_start
        ds = shipped(base if base is not None else loader)  # what each worker receives
        # the training loader built again, by which loop (NOTE [a loader built each epoch])
        figures["built_again"], figures["built_by"] = self.built, self.built_by
        if figures.get("start_method") in ("spawn", "forkserver") and ds is not None:
            if id(ds) not in self.pickled:  # once a dataset: a worker's pickle, counted
                self.pickled[id(ds)] = workers.pickled_bytes(ds)
            figures["dataset_pickled_bytes"] = self.pickled[id(ds)]
        if ds is not None:  # what it holds in memory: a copy in every rank (NOTE in per_rank)
            if id(ds) not in self.held:
                self.held[id(ds)] = workers.held_bytes(ds)
            figures["dataset_held_bytes"], figures["dataset_held_in"] = self.held[id(ds)]
        self._event(LOADER, f"epoch {self.epoch}: batch {figures['batch_bytes'] / 1e6:.1f} "
                    f"MB in {figures['batch_tensors']} tensors, {figures['in_flight']} in "
                    "flight", {**figures, "epoch": self.epoch})

    def _hook_held(self, loader: Any, base: Any) -> None:
        """A loader that keeps its DataLoader iterator across epochs (timm's
        MultiEpochsDataLoader, Ultralytics' InfiniteDataLoader, made lazily at the first
        batch) or this epoch's on an attribute (Ray Train's wrapper): its epochs' iterators
        are generators, so the worker of each batch is read from the iterator it keeps,
        hooked here at an epoch's first batch (once: the hook stays with it). Ultralytics'
        worker table once read 0 batches for both workers."""
        for obj in (base, loader):
            held = held_iterator(obj) if obj is not None else None
            if held is not None:
                workers.hook(held[1], self.probe, None)
                if not self.worker_procs:
                    self.worker_procs = [w for w in getattr(held[1], "_workers", None) or []
                                         if getattr(w, "pid", None)]
                return

    def _workers_ready(self, ready_s: list[float]) -> None:
        """Each worker's first batch, seconds after the epoch's iter() (by worker index)."""
        self._event(WORKERS_READY, f"epoch {self.epoch}: {len(ready_s)} workers ready by "
                    f"{max(ready_s):.2f} s", {"epoch": self.epoch, "ready_s": ready_s})

    def _loader_error(self, exc: BaseException) -> None:
        """The loader raised into the loop (its own error, passed on untouched). Failed
        only once its event is written: a failure before that leaves the death to close()."""
        self._starting = None  # (no first batch to report: the loader is the script's)
        text = workers.error_text(exc)
        if "killed by signal" not in text and (how := workers.exit_note(self.worker_procs, exc)):
            text = f"{text}; {how}"
        text += oom_count.note(self.oom_kills, text)
        self._event(LOADER_ERROR, text, {"error": text, "at_step": self.probe.step})
        self.loader_failed = True
        workers.remove_dead_segments(w.pid for w in self.worker_procs)  # (after the event)

    def _untimed_error(self, exc: BaseException, loader: str, pids: list) -> None:
        """An untimed loader (validation) raised into the loop: named as that loader's
        (NOTE [an untimed loader's stall] in monitor/probe/untimed.py)."""
        text = untimed.named(loader, workers.error_text(exc))
        text += oom_count.note(self.oom_kills, text)
        self._event(LOADER_ERROR, text, {"error": text, "at_step": self.probe.step,
                                         "untimed": loader})
        self.loader_failed = True
        workers.remove_dead_segments(pids)

    # -- the probe's own failures (NOTE [fail-safe probe] in monitor/probe/patch.py) -----
    def is_broken(self, loader: Any) -> bool:
        return id(loader) in self.broken

    def fault(self, exc: Exception, where: str, loader: Any = None) -> None:
        """The probe failed on a loader: it is not timed again, and the run says why (a
        `probe` event with the exception and the loader's class; stderr once)."""
        try:
            key = id(loader) if loader is not None else self.loader_id
            cls = type(loader).__name__ if loader is not None else (self.loader_cls or "?")
            first = key not in self.broken
            if key is not None:
                self.broken.add(key)
            if self.open is not None and (loader is None or key == self.loader_id):
                self.open.passthrough = True
            if not first:
                return
            why = f"{type(exc).__name__}: {exc}"
            text = (f"timing stopped for {cls} ({where}): {why}. Your training goes on "
                    "untouched; its later steps are not recorded")
            self._say(text)
            self._event(PROBE, text, {"stopped": "timing", "loader": cls, "where": where,
                                        "error": why, "at_step": self.probe.step})
        except Exception:  # nothing of ours reaches the loop, even from here
            pass

    def _say_phases(self, text: str, loud: bool = True) -> None:
        """What the phase hooks met (monitor/probe/phases.py), once each: on stderr too
        when it is news to the user (they are off, the optimizer is not torch's)."""
        if text not in self.phases_said:
            self.phases_said.add(text)
            if loud:
                self._say(text)
            self._event(PROBE, text, {"phases": "off" if "off:" in text else "note"})

    def _event(self, kind: str, label: str, data: dict[str, Any] | None = None) -> None:
        """Handed to the probe's writer (the watchdog's thread): never a wait on the store
        from the training thread."""
        if self.stopped:
            return
        data = {**(data or {}), "rank": self.rank}
        if not self.closing:
            self.probe.event(kind, label, data)
            return
        try:
            self.store.add_event(self.run_id, kind, label, data)
        except Exception as exc:
            self._stop_recording(exc)

    @staticmethod
    def _say(text: str) -> None:
        """One line on stderr, on a line of its own: a live progress bar (tqdm, as the HF
        Trainer draws one) holds an unfinished `\r` line, so a newline comes first."""
        tqdm = sys.modules.get("tqdm")
        bar = getattr(getattr(tqdm, "tqdm", None), "_instances", None)
        lead = "\n" if bar else ""
        print(f"{lead}starvation-monitor: {text}", file=sys.stderr)

    def _stop_recording(self, exc: Exception) -> None:
        """Say once why recording stopped; the training goes on untouched."""
        if self.stopped is not None:
            return
        self.stopped = str(exc)
        self.probe.stopped = True
        self.probe.discard()
        self.watchdog.stop()
        self._say(f"recording stopped: {exc}. Your training goes on; its steps are no "
                  "longer recorded.")
        try:  # the store may take this one line yet (a lock that cleared, a full disk freed)
            self.store.add_event(self.run_id, PROBE, f"recording stopped: {exc}",
                                 {"stopped": "recording", "error": str(exc),
                                  "at_step": self.probe.step, "rank": self.rank})
        except Exception:
            try:
                self.store.set_meta(control.probe_stopped_key(self.run_id, self.rank),
                                    f"recording stopped at step {self.probe.step}: {exc}")
            except Exception:
                pass

    # -- epochs and control --------------------------------------------------------------
    @property
    def open(self) -> TimedIterator | None:
        """The timed epoch's iterator while the loop holds it (NOTE [the loop let go])."""
        return self._open()

    @open.setter
    def open(self, it: TimedIterator) -> None:
        if (old := self._open()) is not None:
            old.on_drop = None  # (its pending step ended at this iter(): end_open_step)
        self._open, it.on_drop = weakref.ref(it), lambda n: setattr(self, "let_go", n)

    def start_epoch(self, loader: Any) -> None:
        """At iter(loader): apply pending loader changes, count the epoch (the last epoch's
        steps are the watchdog's to write; the autotuner's handshake writes them first).
        An iterator of this loader that delivered no batch started no epoch: Ultralytics
        calls iter() twice an epoch (`enumerate(loader)`, then again inside its progress
        bar), and its first never runs."""
        it = self.open
        if (n := it.delivered if it is not None else self.let_go) is None or n > 0:
            self.epoch += 1
        # held until the epoch's first batch is reported: `for b in DataLoader(...)` drops
        # the loader once its iterator is made (0 workers were reported for its 2)
        self._starting = loader
        self.look_at_compiles()
        for hook in self.epoch_hooks:
            try:
                hook(self)
            except Exception:  # a hook's failure is its own
                pass
        self.trained = self.trained or grad_enabled()
        ph = self.probe.phases
        if ph is not None and ph.note:  # (the optimizer is not a torch one: said once)
            self._say_phases(f"step phases: {ph.note}")
        if self.stopped:
            return
        try:
            if self.epoch > 0:
                self._fill_batch_size(loader)
                self._check_retunable(loader)
                self._await_tuner()
            self._epoch_control(loader)
        except Exception as exc:  # the store failed: the training goes on without us
            self._stop_recording(exc)

    def _fill_batch_size(self, loader: Any) -> None:
        """A loader that batches in its dataset reports no batch size: the first batch's
        samples stand for it, with its settings (as last reported where it is gone)."""
        if self.batch_filled or self.probe.first_samples is None or not self.batchless:
            return
        self.batch_filled = True
        settings = loader_settings(loader) if loader is not None else self.reported
        self._report({**settings, "batch_size": self.probe.first_samples})

    def note_workers(self, loader: Any, it: Any) -> None:
        """The epoch's worker PIDs (loaders.worker_procs), as its `epoch` event."""
        self.worker_procs = worker_procs(loader, it)
        pids = [w.pid for w in self.worker_procs]
        if pids:
            self._event(EPOCH, f"epoch {self.epoch}", {"worker_pids": pids})
