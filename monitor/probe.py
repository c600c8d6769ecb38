"""The probe: runs inside the training process and times every step.

For each batch it measures the data wait (seconds blocked in `next(iterator)`, with the
`iter()` call that starts the workers counted in the epoch's first wait, since the device idles
through it too) and the compute (from receiving the batch to asking for the next). Records are
batched and written every `flush_interval` seconds outside the timed intervals, so the probe's
own cost is in neither. It also polls the store's control table for the workload's requests.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from monitor.records import StepRecord
from monitor.store import Store


def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor-like item."""
    item = batch
    if isinstance(item, dict) and item:
        item = next(iter(item.values()))
    elif isinstance(item, (list, tuple)) and item:
        item = item[0]
    shape = getattr(item, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(item)
    except TypeError:
        return 1


class Probe:
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
        self._buffer: list[StepRecord] = []
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
        self.recent_steps: deque[float] = deque(maxlen=64)
        self._lock = threading.Lock()  # the buffer is flushed by the watchdog too

    def wall(self, t: float) -> float:
        return self._anchor_wall + (t - self._anchor_clock)

    def iterate(
        self, loader: Iterable[Any], epoch: int, between: Callable[[], bool] | None = None
    ) -> Iterator[Any]:
        """Yield the loader's batches, recording wait and compute of each step.

        `between` runs in the gap after each step's compute is stamped and before the next
        wait starts (so its cost is in neither); when it returns True the iteration ends.
        """
        t0 = self.waiting_since = self.clock()
        it = iter(loader)
        self.current_iterator = it
        while True:
            try:
                batch = next(it)
            except StopIteration:
                self.waiting_since = None
                return
            t1 = self.clock()
            self.waiting_since = None
            yield batch
            self.record(epoch, t0, t1, self.clock(), batch)
            if between is not None and between():
                return
            t0 = self.waiting_since = self.clock()

    def record(self, epoch: int, t_req: float, t_got: float, t_next: float, batch: Any) -> None:
        """One step: asked for the batch at t_req, got it at t_got, asked for the next at
        t_next (this probe's clock). Writes the buffer when flush_interval has passed."""
        rec = StepRecord(
            run_id=self.run_id, step=self.step, epoch=epoch, ts=self.wall(t_got),
            wait_s=t_got - t_req, compute_s=t_next - t_got, samples=batch_len(batch),
            config_seq=self.config_seq, copy_s=self.copy_s, rank=self.rank,
        )
        with self._lock:
            self._buffer.append(rec)
        self.recent_steps.append(t_next - t_req)
        self.copy_s = None
        self.step += 1
        if t_next - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            buf, self._buffer = self._buffer, []
            self._last_flush = self.clock()
        if buf:
            self.store.insert(buf)

    def flush_if_due(self) -> None:
        """Write what a stuck loop buffered (the watchdog calls this once a second)."""
        if self.clock() - self._last_flush >= self.flush_interval:
            self.flush()

    def discard(self) -> None:
        """Drop unwritten records (after a write failed: the run goes on without them)."""
        with self._lock:
            self._buffer = []
            self._last_flush = self.clock()

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
