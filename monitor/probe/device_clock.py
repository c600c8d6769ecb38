"""The device's own clock on CUDA: per-step device idle and span from CUDA events, never a
synchronize.

A training loop on a GPU is asynchronous: the host enqueues kernels and runs ahead, so host
timing says little about the device. On the training thread, on its current stream, the
probe records event A_i right after next() returned batch i and event B_i right before it
asks for batch i+1. The stream reaches A_i once every kernel queued before it is done, so

    device span of step i   = A_i.elapsed_time(B_i)       the device time step i's work took
    device idle before i+1  = B_i.elapsed_time(A_{i+1})   the device with nothing to do while
                                                          the host waited for batch i+1

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

POOL = 64  # events kept for reuse
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
        self.prev: tuple[int, Any] | None = None  # the last harvested (step, B)
        self.dropped = 0
        self.measured = 0
        self.failed: str | None = None  # why events were given up (an error from CUDA)
        self._look_in = 0  # steps until the next look for CUDA

    def look(self) -> None:
        """Look for CUDA at the next step (an epoch starts: a script that moved its model to
        the device since is timed from its first batch)."""
        self._look_in = 0

    def _ready(self) -> bool:
        if self.active:
            return True
        if self.failed is not None:
            return False
        self._look_in -= 1
        if self._look_in >= 0:  # not yet: a comparison a step, not a call into torch
            return False
        self._look_in = LOOK_EVERY - 1
        cuda = self._cuda
        if cuda is None:
            torch = sys.modules.get("torch")
            cuda = getattr(torch, "cuda", None)
        try:
            if cuda is not None and cuda.is_initialized():  # never initialises it
                self._cuda, self.active = cuda, True
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
        self.pending.clear()
        self.current = self.prev = None

    def batch_arrived(self, step: int) -> None:
        """A_step: next() has just returned the batch of `step`."""
        if not self._ready():
            return
        try:
            self.current = (step, self._record())
        except Exception as exc:
            self._give_up(exc)

    def batch_done(self) -> None:
        """B: the loop asks for the next batch (or the epoch ended)."""
        if self.current is None or not self.active:
            return
        step, a = self.current
        self.current = None
        try:
            self.pending.append((step, a, self._record()))
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
            out = {s for s, _, _ in tuple(self.pending)}
        except RuntimeError:  # the training thread changed it meanwhile: hold nothing back
            return set()
        cur = self.current
        if cur is not None:
            out.add(cur[0])
        return out

    def harvest(self) -> dict[int, tuple[float | None, float]]:
        """{step: (device idle before it, device span of it)} in seconds, for the steps whose
        events are complete, oldest first; never blocks."""
        out: dict[int, tuple[float | None, float]] = {}
        if not self.active:
            return out
        try:
            while self.pending:
                step, a, b = self.pending[0]
                if not b.query():  # B complete means A is too (one stream, in order)
                    break
                self.pending.popleft()
                span = a.elapsed_time(b) / 1000.0
                idle = None
                if self.prev is not None and self.prev[0] == step - 1:
                    idle = max(0.0, self.prev[1].elapsed_time(a) / 1000.0)
                out[step] = (idle, max(0.0, span))
                self.measured += 1
                if self.prev is not None and len(self.pool) < POOL:
                    self.pool.append(self.prev[1])
                if len(self.pool) < POOL:
                    self.pool.append(a)
                self.prev = (step, b)
        except Exception as exc:
            self._give_up(exc)
        return out
