"""The device's own clock on CUDA: per-step device idle and span from CUDA events, never a
synchronize.

A training loop on a GPU is asynchronous: the host enqueues kernels and runs ahead, so host
timing says little about the device. On the training thread, on its current stream, the
probe records event A_i right after next() returned batch i and event B_i right before it
asks for batch i+1. The stream reaches A_i once every kernel queued before it is done, so

    device span of step i   = A_i.elapsed_time(B_i)       the device time step i's work took
    device idle before i+1  = B_i.elapsed_time(A_{i+1})   the device with nothing to do while
                                                          the host waited for batch i+1

The step's phases (monitor/probe/phases.py) are device time the same way: the phase hooks
`mark()` an event on the same stream at each boundary (forward, backward and optimizer step,
start and end), and a phase's device time is its start event's elapsed time to its end
event's, summed over the step; an optimizer step's own time excludes the forward and backward
passes run inside it (a closure's).

Events are read only when `query()` says they are complete, and only from the training
thread (a query from another thread can break that thread's CUDA-graph capture); events not
complete after MAX_PENDING steps are dropped and counted. Nothing runs until the script
itself has initialised CUDA (`torch.cuda.is_initialized()`): no context is ever created, no
device set. Standard library only, torch read from sys.modules (the probe's fence).
"""
from __future__ import annotations

import sys
from collections import deque
from typing import Any

from monitor.probe.syncs import SyncCount

POOL = 256  # events kept for reuse (two a step, and two a phase where phases are timed)
FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2  # mark()'s phases, in take()'s order
MAX_PENDING = 32  # steps whose events may be outstanding before the oldest are dropped
HOLD_S = 2.0  # a step whose events are outstanding waits this long to be written with them
LOOK_EVERY = 64  # steps between looks for CUDA (and at each epoch's start) until it is used


class DeviceClock:
    """One per probe; every method is called on the training thread."""

    def __init__(self, cuda: Any = None) -> None:
        self._cuda = cuda  # injected by tests; else torch.cuda once the script uses it
        self.active = False
        self.pool: list[Any] = []
        self.pending: deque[tuple[int, Any, Any]] = deque()  # (step, A, B), oldest first
        self.current: tuple[int, Any] | None = None  # (step, A) awaiting its B
        self.marks: list[tuple[int, bool, Any]] = []  # the current step's (phase, end, event)
        self.prev: tuple[int, Any] | None = None  # the last harvested (step, B)
        self.dropped = 0
        self.measured = 0
        self.failed: str | None = None  # why events were given up (an error from CUDA)
        # the step from which to look for CUDA again: the loop calls batch_arrived only when
        # `active or step >= look_at` (a comparison a step, not a call)
        self.look_at = 0
        self.syncs: SyncCount | None = None  # the host's syncs on a sample of steps

    def look(self) -> None:
        """Look for CUDA at the next step (an epoch starts: a script that moved its model to
        the device since is timed from its first batch)."""
        if self.failed is None:
            self.look_at = 0

    def _ready(self, step: int) -> bool:
        if self.active:
            return True
        if self.failed is not None or step < self.look_at:
            return False
        self.look_at = step + LOOK_EVERY
        cuda = self._cuda
        if cuda is None:
            torch = sys.modules.get("torch")
            cuda = getattr(torch, "cuda", None)
        try:
            if cuda is not None and cuda.is_initialized():  # never initialises it
                self._cuda, self.active = cuda, True
                self.syncs = SyncCount(cuda)  # NOTE [counting syncs] in syncs.py
        except Exception:  # a broken CUDA install is the script's to report
            return False
        return self.active

    def _record(self) -> Any:
        e = self.pool.pop() if self.pool else self._cuda.Event(enable_timing=True)
        e.record()  # the current stream of the current device
        return e

    def _give_up(self, exc: BaseException) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        self.active = False
        self.look_at = sys.maxsize  # never again this run
        self.pending.clear()
        self.marks = []
        self.current = self.prev = None

    def batch_arrived(self, step: int) -> None:
        """A_step: next() has just returned the batch of `step`."""
        if not self._ready(step):
            return
        try:
            self.marks = []  # (a phase before the batch arrived is no step's)
            self.current = (step, self._record())
        except Exception as exc:
            self._give_up(exc)
            return
        if self.syncs is not None and step >= self.syncs.next_at:
            self.syncs.start(step)

    def mark(self, phase: int, end: bool) -> None:
        """A phase of the current step starts or ends (FORWARD, BACKWARD, OPTIMIZER): an
        event where the stream has reached, as A and B are."""
        if self.current is None or not self.active:
            return
        try:
            self.marks.append((phase, end, self._record()))
        except Exception as exc:
            self._give_up(exc)

    def batch_done(self) -> None:
        """B: the loop asks for the next batch (or the epoch ended)."""
        if self.current is None or not self.active:
            return
        if self.syncs is not None and self.syncs.on:
            self.syncs.stop()
        step, a = self.current
        marks, self.current, self.marks = self.marks, None, []
        try:
            self.pending.append((step, a, self._record(), marks))
        except Exception as exc:
            self._give_up(exc)
            return
        while len(self.pending) > MAX_PENDING:  # never waited for: dropped, counted
            self.pending.popleft()
            self.dropped += 1
            self.prev = None

    def waiting(self) -> set[int]:
        """Steps whose timings may still come (any thread may ask: no CUDA call)."""
        try:
            out = {p[0] for p in tuple(self.pending)}
        except RuntimeError:  # the training thread changed it meanwhile: hold nothing back
            return set()
        cur = self.current
        if cur is not None:
            out.add(cur[0])
        return out

    def harvest(self) -> dict[int, tuple[float | None, float, tuple[float | None, ...] | None]]:
        """{step: (device idle before it, device span of it, its (forward, backward,
        optimizer) device time or None where no phase was marked)} in seconds, for the steps
        whose events are complete, oldest first; never blocks."""
        out: dict[int, tuple[float | None, float, tuple[float | None, ...] | None]] = {}
        if not self.active:
            return out
        try:
            while self.pending:
                step, a, b, marks = self.pending[0]
                if not b.query():  # B complete means A is too (one stream, in order)
                    break
                self.pending.popleft()
                span = a.elapsed_time(b) / 1000.0
                idle = None
                if self.prev is not None and self.prev[0] == step - 1:
                    idle = max(0.0, self.prev[1].elapsed_time(a) / 1000.0)
                out[step] = (idle, max(0.0, span), _phase_times(marks) if marks else None)
                self.measured += 1
                for _, _, e in marks:
                    if len(self.pool) < POOL:
                        self.pool.append(e)
                if self.prev is not None and len(self.pool) < POOL:
                    self.pool.append(self.prev[1])
                if len(self.pool) < POOL:
                    self.pool.append(a)
                self.prev = (step, b)
        except Exception as exc:
            self._give_up(exc)
        return out


def _phase_times(marks: list[tuple[int, bool, Any]]) -> tuple[float | None, ...]:
    """(forward, backward, optimizer) device seconds of one step from its marks, in order:
    each phase's start to its end, summed; the optimizer step less the passes run inside it
    (a closure's); None for a phase with no start and end marked."""
    sums: list[float | None] = [None, None, None]
    start: list[Any] = [None, None, None]
    inner = 0.0  # forward and backward device time since the optimizer step opened
    for phase, end, e in marks:
        if not end:
            start[phase] = e
            if phase == OPTIMIZER:
                inner = 0.0
            continue
        if start[phase] is None:
            continue
        d = max(0.0, start[phase].elapsed_time(e) / 1000.0)
        start[phase] = None
        if phase == OPTIMIZER:
            d = max(0.0, d - inner)
        elif start[OPTIMIZER] is not None:
            inner += d
        sums[phase] = (sums[phase] or 0.0) + d
    return tuple(sums)
