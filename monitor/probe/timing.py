"""The one timing loop, inside the training process: the managed workload and the attach
probe both time their steps with TimedIterator and write them through a Probe.

For each batch it measures the data wait (seconds blocked in `next(iterator)`, with the
`iter()` call that starts the workers counted in the epoch's first wait, since the device idles
through it too) and the compute (from receiving the batch to asking for the next). A step is
recorded when the next batch is asked for; the `next()` that ends the epoch (StopIteration)
records the last step and is not a step itself. The Probe also polls the store's control
table for the managed workload's requests.

The training thread only appends a step's figures, a plain tuple, to a bounded deque (no
record object, no lock, no store); the Probe's write half (monitor/probe/writer.py) turns
them into rows and writes them: the managed workload inline every `flush_interval` outside
the timed intervals, the attach probe on its watchdog's thread (monitor/probe/watchdog.py),
so a slow or locked store never holds the user's loop.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from monitor.probe import workers
from monitor.probe.device_clock import DeviceClock
from monitor.probe.samples import sample_counter
from monitor.probe.writer import StepWriter
from monitor.records import SYNCS
from monitor.ring import STEP, STEP_PENDING, RingWriter
from monitor.store import Store

BUFFER_MAX = 200_000  # unwritten steps kept (minutes of a fast loop); older ones dropped
EVENTS_MAX = 1_000  # unwritten events kept
NO_PHASES = (None, None, None)


class ProbeStateError(RuntimeError):
    """The timing loop found a state it never expects (its own bug, or a loader that
    bypasses it): the attach probe stops timing that loader (NOTE [fail-safe probe])."""


class Probe(StepWriter):
    """Times the steps of one run and writes StepRecords to the store in batches."""

    def __init__(
        self,
        store: Store,
        run_id: int,
        flush_interval: float = 0.5,
        control_interval: float = 0.25,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
        rank: int = 0,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.rank = rank  # torch.distributed RANK of this process (0 alone)
        self.flush_interval = flush_interval
        self.control_interval = control_interval
        self.clock = clock
        # Wall-clock stamps derive from one anchor, so they share perf_counter's steadiness.
        self._anchor_clock = clock()
        self._anchor_wall = wall()
        # (step, epoch, t_got, wait, compute, samples, config_seq, copy_s, worker, held,
        #  ready, wait_cpu, wait_runq, forward, backward, optimizer)
        self._buffer: deque[tuple[Any, ...]] = deque(maxlen=BUFFER_MAX)
        self._unwritten: list[tuple[Any, ...]] = []  # the writer's: held back or to retry
        # step -> CUDA times: (idle, span, its phases' or None)
        self._device_s: dict[int, tuple[float | None, float, tuple[float | None, ...] | None]] \
            = {}
        self.dropped = 0  # steps dropped past BUFFER_MAX (the store could not keep up)
        self._said_dropped = 0
        self._failing_since: float | None = None
        self.last_write_error: str | None = None
        # events the loop's thread hands to the writer: (ts, kind, label, data)
        self._events: deque[tuple[float, str, str, dict[str, Any] | None]] = deque(
            maxlen=EVENTS_MAX)
        self._last_flush = self._anchor_clock
        self._last_control = self._anchor_clock
        self._last_control_id = 0
        self.step = 0
        self.config_seq = 0
        self.copy_s: float | None = None  # set by a CUDA step: its host-to-device copy
        self.current_iterator: Iterator[Any] | None = None
        # For the watchdog (another thread): since when the loop has waited for a batch
        # (None while it computes), and the last steps' durations.
        self.waiting_since: float | None = None
        self.waiting_first = False  # ...for an epoch's first batch (its workers start)
        # ... and for an untimed loader's batch: (since, its pass's first?, the loader), set
        # by monitor/probe/untimed.py (NOTE [an untimed loader's stall] there)
        self.untimed: tuple[float, bool, str] | None = None
        self.first_batch_s: float | None = None  # the run's first batch, as it took
        self.first_samples: int | None = None  # its samples (a loader that batches itself)
        self.count_samples: Callable[[Any], int] | None = None  # sample_counter's, per run
        self.samples_from: str | None = None
        self.recent_steps: deque[float] = deque(maxlen=64)
        self._lock = threading.Lock()  # one writer at a time (the watchdog's, the loop's)
        # Called with the exception when a write fails (the attach probe: the training goes
        # on without us); None: the exception propagates (the managed workload fails).
        self.on_error: Callable[[Exception], None] | None = None
        # Called with (exception, where) when the timing loop's own bookkeeping fails (the
        # attach probe: stop timing that loader); None: raised (the managed workload).
        self.on_fault: Callable[[Exception, str], None] | None = None
        # Set per batch by monitor/probe/workers.py's hook on a multiprocessing iterator.
        self.batch_worker: int | None = None
        self.batch_held: int | None = None
        self.batch_ready: int | None = None
        self.batch_wait_cpu: float | None = None
        self.batch_wait_runq: float | None = None
        # The attach probe's: an epoch's first batch (its loader report), and the loader's
        # own error on its way to the loop (both called inside the probe's guards).
        self.on_first_batch: Callable[[Any, Any], None] | None = None
        self.on_loader_error: Callable[[BaseException], None] | None = None
        # ... and an untimed loader's (monitor/probe/untimed.py): (error, loader, worker pids)
        self.on_untimed_error: Callable[[BaseException, str, list], None] | None = None
        # ... and each worker's first batch, once all have delivered one (seconds from the
        # epoch's iter(), by worker index)
        self.on_workers_ready: Callable[[list[float]], None] | None = None
        self.stopped = False
        # False: another thread writes the buffer (the attach probe's watchdog, every
        # flush_interval): the training thread only appends, never waits on the store
        self.inline_flush = True
        self.device = DeviceClock()  # CUDA events, once the script uses CUDA
        self.phases: Any = None  # monitor/probe/phases.py's, where the attach probe has them
        # under `monitor run`: the relay's ring (monitor/ring.py), written instead of the
        # buffer, read and stored by `monitor run`'s own process (NOTE [the relay])
        self.ring: RingWriter | None = None

    def wall(self, t: float) -> float:
        return self._anchor_wall + (t - self._anchor_clock)

    def iterate(self, loader: Iterable[Any], epoch: int,
                between: Callable[[], bool] | None = None) -> TimedIterator:
        """The loader's batches for one epoch, each step timed (TimedIterator); the managed
        workload's loop. `between` runs after each step is recorded, before the next wait
        starts (its cost is in neither); when it returns True the epoch ends."""
        it = TimedIterator(self, epoch, lambda: iter(loader),
                           between=(lambda _it: between()) if between is not None else None)
        self.current_iterator = it
        return it

    def record(self, epoch: int, t_req: float, t_got: float, t_next: float, batch: Any) -> bool:
        """One step: asked for the batch at t_req, got it at t_got, asked for the next at
        t_next (this probe's clock). Appends it; writes the buffer when flush_interval has
        passed and this thread is the writer (`inline_flush`): True when it did."""
        if self.stopped:
            return False
        count = self.count_samples
        if count is None:
            count, self.samples_from = sample_counter(batch)
            self.count_samples = count
        samples = count(batch)
        if self.first_samples is None:
            self.first_samples = samples
        step, ph, ring = self.step, self.phases, self.ring
        # unpacked here: a call with *args builds a tuple and takes CPython's slow call path
        fwd, bwd, opt = ph.take(t_next) if ph is not None else NO_PHASES
        # the step in STEP_FIELDS' order (monitor/records.py, NOTE [a step's fields]): this
        # is their one producer
        rec = (step, epoch, t_got, t_got - t_req, t_next - t_got, samples, self.config_seq,
               self.copy_s, self.batch_worker, self.batch_held, self.batch_ready,
               self.batch_wait_cpu, self.batch_wait_runq, fwd, bwd, opt)
        if ring is not None:  # under `monitor run`: into the relay's ring (monitor/ring.py)
            ring.put(STEP_PENDING if self.device.active else STEP, rec)
        else:
            buf = self._buffer
            if len(buf) == buf.maxlen:
                self.dropped += 1  # the deque drops its oldest on this append
            buf.append(rec)
        if self.device.active:
            self._device_times()
        self.recent_steps.append(t_next - t_req)
        self.copy_s = self.batch_worker = self.batch_held = self.batch_ready = None
        self.batch_wait_cpu = self.batch_wait_runq = None
        self.step = step + 1
        if self.inline_flush and t_next - self._last_flush >= self.flush_interval:
            self.flush()
            return True
        return False

    def _device_times(self) -> None:
        """Completed CUDA events, kept for the writer (the training thread only: the one
        that may query them)."""
        timed = self.device.harvest()
        sc = self.device.syncs
        if sc is not None and sc.report is not None:  # NOTE [counting syncs]
            r, sc.report = sc.report, None
            self.event(SYNCS, f"{r['per_step']:.1f} CUDA syncs a step ({r['steps']} steps "
                       "counted)", r)
        if timed and self.ring is not None:
            for step, (idle, span, phases) in timed.items():
                self.ring.put_device(step, idle, span, phases)
        elif timed:
            self._device_s.update(timed)

    def control_due(self) -> bool:
        now = self.clock()
        if now - self._last_control >= self.control_interval:
            self._last_control = now
            return True
        return False

    def poll_control(self) -> list[tuple[int, str, Any]]:
        """New control requests for this run (each returned once)."""
        reqs = self.store.pending_control(self.run_id, self._last_control_id)
        if reqs:
            self._last_control_id = reqs[-1][0]
        return reqs


Between = Callable[["TimedIterator"], bool]


# NOTE [the loop let go]
# A loop that breaks mid-epoch lets go of its iterator, and bare, the DataLoader's
# iterator goes with it at once: its __del__ shuts the workers down gently (each removes
# its /tmp/pymp-* folder). So the probe never keeps the iterator it times alive: the
# attach probe holds it by a weak reference (Recorder.open), and the loader too (one with
# persistent_workers holds its iterator: Recorder._timed; held strongly, its workers lived
# until exit and were killed there, a folder each), the workers' hook holds no
# bound method of it (NOTE [no cycle through the iterator] in workers.py), and when the
# loop lets go this tells the recorder how many batches it delivered (an iterator that
# delivered none started no epoch). The pending step is recorded, its compute ending
# now, where the epoch was delivered whole (a loop that stops by length: `zip(range(n),
# loader)`); a loop that let go mid-epoch (a break, an exception) drops it, as at exit:
# whether its batch was computed at all cannot be told. Only in the loop's thread (a
# collection in another thread must not write the loop's ring) and only while `on_drop`
# is set (the recorder clears it at exit, past its last flush).


class TimedIterator:
    """Times each next() of one epoch's iterator and the gap until the following one.

    `make_iter()` builds the underlying iterator (DataLoader.__iter__, or one over a resumable
    epoch plan); `between(self)` runs after each step is recorded, before the next wait
    starts, and may `replace()` the underlying iterator (a mid-epoch loader change) or
    return True to end the epoch. The watchdog reads `probe.waiting_since`, which only this
    loop writes."""

    # (a class default: __del__ runs on one whose make_iter() raised, before __init__ set it)
    on_drop: Callable[[int], None] | None = None  # NOTE [the loop let go]

    def __init__(self, probe: Probe, epoch: int, make_iter: Callable[[], Iterator[Any]],
                 t_start: float | None = None, between: Between | None = None) -> None:
        self.probe, self.epoch, self._between = probe, epoch, between
        # iter() counts in the epoch's first wait: workers start there
        self._t_req: float | None = t_start if t_start is not None else probe.clock()
        probe.waiting_first = True
        probe.waiting_since = self._t_req
        probe.device.look()
        self._inner = make_iter()
        self.t_start = self._t_req
        self.iter_s = probe.clock() - self._t_req  # the loader's own iter(): workers started
        self._hook(self._inner)
        self._t_got: float | None = None
        self._batch: Any = None
        self.delivered = 0
        self.ended = False
        self.passthrough = False  # the probe failed: batches pass through untimed
        self.expected: int | None = None  # the epoch's length, read at its first batch
        self._thread = threading.get_ident()

    @property
    def inner(self) -> Iterator[Any]:
        return self._inner

    def __del__(self) -> None:  # NOTE [the loop let go]
        drop = self.on_drop
        if drop is None:
            return
        try:
            drop(self.delivered)
            if threading.get_ident() == self._thread and not self.ended and \
                    not self.passthrough and self.complete():
                self.finish()
        except Exception:  # at a drop, never in the way of the user's code
            pass

    def begun(self, t_req: float, t_got: float, batch: Any) -> None:
        """Its first batch came before it was timed (Recorder.probation): that batch's ask
        and arrival as if timed; its step is recorded at the next next()."""
        self._t_req, self._t_got, self._batch, self.t_start = t_req, t_got, batch, t_req
        self._first(batch)
        self.delivered = 1

    def replace(self, inner: Iterator[Any]) -> None:
        self._inner = inner
        self._hook(inner)

    def _hook(self, inner: Any) -> None:
        try:
            workers.hook(inner, self.probe, self.t_start)
        except Exception:  # worker figures are extra: the timing goes on without them
            pass

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        """The next batch, timed. Only `next(inner)` may raise into the loop (the user's own
        loader's errors and StopIteration, untouched); an error in the probe's own
        bookkeeping goes to `probe.on_fault`, after which this epoch passes through
        untimed (NOTE [fail-safe probe] in monitor/probe/patch.py).

        This is the per-step path of the user's loop, so it is one frame with the step's
        record (Probe.record) its one call: each call and attribute it touches costs more
        after a real step has evicted it from the caches than in a loop that does nothing
        (docs/benchmarks.md)."""
        if self.ended:
            raise StopIteration
        if self.passthrough:
            return next(self._inner)
        p = self.probe
        try:
            if self._t_got is not None:  # the last step ends: recorded
                t_req = self._t_req
                if t_req is None:  # never expected: one iterator timed twice over
                    raise ProbeStateError("a batch was delivered with no time it was asked "
                                          "for")
                if p.device.current is not None:
                    p.device.batch_done()  # B: the step's work is queued
                t_next = p.clock()
                # the next wait starts where the step ended, unless a write or `between`
                # took time in between (its cost is in neither)
                flushed = p.record(self.epoch, t_req, self._t_got, t_next, self._batch)
                self._t_got = self._batch = None
                self._t_req = t_next if not flushed and self._between is None else None
                if self._between is not None and self._between(self):
                    self._end_safely()  # `between` ended the epoch (a stop or a change)
                    raise StopIteration
            if self._t_req is None:
                self._t_req = p.clock()
            p.waiting_first = self.delivered == 0
            p.waiting_since = self._t_req  # the watchdog's clock: waiting for data
        except StopIteration:
            raise
        except Exception as exc:
            self._fault(exc, "before next()")
            return next(self._inner)
        try:
            batch = next(self._inner)
        except StopIteration:
            p.waiting_since = None
            self._end_safely()
            raise
        except BaseException as exc:  # the loader's own error: recorded, then the loop's
            p.waiting_since = None
            self._loader_error(exc)
            raise
        try:
            self._t_got = p.clock()
            p.waiting_since = None
            self._batch = batch
            step, dev = p.step, p.device
            if dev.active or step >= dev.look_at:
                dev.batch_arrived(step)  # A: the batch is here (the step it will be)
            if self.delivered == 0:
                self._first(batch)
            self.delivered += 1
        except Exception as exc:
            self._fault(exc, "after next()")
        return batch

    def _first(self, batch: Any) -> None:
        """The epoch's first batch: the run's first wait, the epoch's length, the loader's
        report."""
        p = self.probe
        if p.first_batch_s is None and self._t_req is not None:
            p.first_batch_s = self._t_got - self._t_req  # type: ignore[operator]
        try:
            self.expected = len(self)
        except Exception:  # an iterable of no length: its epoch ends by StopIteration
            self.expected = None
        if p.on_first_batch is not None:
            try:
                p.on_first_batch(batch, self._inner)
            except Exception:  # the epoch's report is extra: the timing goes on
                pass

    def _loader_error(self, exc: BaseException) -> None:
        handler = self.probe.on_loader_error
        if handler is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            try:
                if self.delivered == 0 and self.probe.on_first_batch is not None:
                    # it failed before its first batch: the epoch's report without one
                    # (/dev/shm's size, the workers in flight), for the failure's reason
                    self.probe.on_first_batch(None, self._inner)
                handler(exc)
            except Exception:
                pass

    def _fault(self, exc: Exception, where: str) -> None:
        """The probe's own error: the rest of the epoch passes through untimed and the
        recorder is told (it stops timing the loader); without a handler (the managed
        workload: our own process) the error is raised."""
        self.passthrough = True
        self._t_got, self._batch = None, None
        self.probe.waiting_since = None
        handler = self.probe.on_fault
        if handler is None:
            raise exc
        handler(exc, where)

    def finish(self) -> None:
        """Record the step of the batch last delivered, its compute ending now: at the next
        next(), or when the epoch is known to have ended without one (another iter(), the
        process's exit after a whole epoch). The next wait starts at the next next()."""
        p = self.probe
        if self._t_got is not None:
            if self._t_req is None:  # never expected: one iterator timed twice over
                raise ProbeStateError("a batch was delivered with no time it was asked for")
            p.device.batch_done()  # B: the step's work is queued; the next wait begins
            p.record(self.epoch, self._t_req, self._t_got, p.clock(), self._batch)
            self._t_got, self._batch = None, None
        self._t_req = None

    def complete(self) -> bool:
        """Whether every batch of the epoch has been delivered (a sized loader)."""
        try:
            return self.delivered >= len(self)
        except Exception:  # no length, or one that is gone (a CombinedLoader after fit)
            return self.expected is not None and self.delivered >= self.expected

    def _end(self) -> None:
        self.ended = True
        self.probe.waiting_since = None
        self.probe.device.batch_done()
        if self.probe.inline_flush:  # else the writer thread has it within flush_interval
            self.probe.flush()

    def _end_safely(self) -> None:
        try:
            self._end()
        except Exception as exc:
            self._fault(exc, "at the epoch's end")

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]  # the whole epoch's (epoch_plan)

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not built yet (or being unpickled): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)
