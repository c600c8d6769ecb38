"""The attach probe's writer (monitor/probe/timing.py's Probe is one): the steps the training
thread appended, as tuples, turned into the steps table's rows and written many a statement
(one GIL release a flush, not one a row: a writer thread beside a busy loop waits out the
switch interval each time it takes the GIL back), with the events handed over beside them. A
write that fails for a reason that passes (a lock, a full disk) is retried with its steps
kept, up to the buffer's bound (then the oldest are dropped and counted in one stored note),
and given up after WRITE_GIVE_UP_S; one that cannot pass stops recording (on_error), never
the training. Standard library only (the probe's fence).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from monitor.probe.device_clock import HOLD_S
from monitor.records import PHASES_AT, PROBE, STEP_AT, StepRecord
from monitor.ring import DEVICE, RingWriter, as_device, as_step
from monitor.ring import ENV as RELAY_ENV

NO_DEVICE = (None, None, None)  # a step with no device times, or no phase marked on it
RELAY_WAIT_S = 2.0  # the longest flush() waits for `monitor run` to store the ring's steps
WRITE_GIVE_UP_S = 60.0  # a store failing this long stops recording (the training goes on)
TS_AT = STEP_AT["ts"]  # the probe's clock in the tuple: wall time in the row


def step_row(run_id: int, rank: int, rec: tuple[Any, ...], ts: float,
             device: tuple[Any, ...]) -> tuple[Any, ...]:
    """A step in the probe's tuple (STEP_FIELDS' order) as the steps table's row
    (StepRecord's columns): `ts` its wall time; `device` its (idle, span, phases) where the
    device clock timed it, which then stand for the host's phases (a row never mixes the
    two; DeviceClock.harvest). The writer's and the relay's one row builder."""
    idle, span, phases = device
    row = list(rec)
    row[TS_AT] = ts
    if span is not None:
        row[PHASES_AT:PHASES_AT + 3] = phases or NO_DEVICE
    return (run_id, *row, rank, idle, span)


def relay_ring(probe: Any, say: Callable[[str], None]) -> RingWriter | None:
    """Under `monitor run`, the relay's ring for this probe (NOTE [the relay] in
    monitor/manage/relay.py); None alone, or when it cannot be made (said once: the
    watchdog's thread writes the steps instead)."""
    folder = os.environ.get(RELAY_ENV)
    if not folder:
        return None
    try:
        return RingWriter(folder, probe.rank, probe._anchor_clock, probe._anchor_wall)
    except Exception as exc:
        say(f"the relay's ring could not be made ({exc}); steps are written from a thread "
            "of this process instead")
        return None


def transient(exc: BaseException) -> bool:
    """A write failure that can pass by itself: another writer's lock, a full disk."""
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg or "is full" in msg


class StepWriter:
    """The write half of a Probe: its attributes (_buffer, _events, _unwritten, store, ...)
    are set by Probe.__init__."""

    _buffer: Any
    _events: Any
    _unwritten: list[tuple[Any, ...]]
    _device_s: dict[int, tuple[float | None, float, tuple[float | None, ...] | None]]
    _lock: Any
    store: Any
    device: Any
    ring: Any  # monitor/ring.py's RingWriter under `monitor run`: its process writes

    def flush_final(self) -> None:
        """The loop is over (on the training thread): what the device has finished, then
        every buffered step."""
        self._device_times()
        if self.ring is not None:
            self.ring.close()
            return
        self.flush(final=True)

    def _row_of(self, r: tuple[Any, ...]) -> tuple[Any, ...]:
        """A buffered step as the steps table's row (step_row)."""
        return step_row(self.run_id, self.rank, r, self.wall(r[TS_AT]),
                        self._device_s.pop(r[0], NO_DEVICE))

    def flush(self, final: bool = False) -> None:
        """Write the buffered steps; those whose CUDA events are still outstanding wait for
        the next flush (at most HOLD_S), unless `final` (the loop is over). Under the
        relay: wait (at most RELAY_WAIT_S) until `monitor run` has stored what was put."""
        if self.ring is not None:
            self.ring.wait_consumed(RELAY_WAIT_S)
            return
        with self._lock:
            self._last_flush = now = self.clock()
            if self.stopped:
                return
            if self._events:
                self._write_events()
            buf = self._buffer
            rows = self._unwritten + [buf.popleft() for _ in range(len(buf))]
            waiting = self.device.waiting() if self.device.active and not final else ()
            hold = [r for r in rows if r[0] in waiting and now - r[TS_AT] < HOLD_S] \
                if waiting else []
            ready = [r for r in rows if r[0] not in waiting or now - r[TS_AT] >= HOLD_S] \
                if hold else rows
            self._unwritten = hold
            if ready:
                self._write(ready, final)

    def event(self, kind: str, label: str, data: dict[str, Any] | None = None) -> None:
        """An event for the writer to store with the steps (stamped now): the attach
        probe's loop never waits on the store for one."""
        if self.ring is not None:
            try:
                self.ring.event(self.wall(self.clock()), kind, label, data)
            except Exception:  # the ring's file refused it: this one event goes to the store
                try:
                    self.store.add_event(self.run_id, kind, label, data)
                except Exception:  # neither can take it (a full disk): the event is lost
                    pass
            return
        self._events.append((self.wall(self.clock()), kind, label, data))

    def _write_events(self) -> None:
        ev = self._events
        while ev:
            ts, kind, label, data = ev[0]
            try:
                self.store.add_event(self.run_id, kind, label, data, ts=ts)
            except Exception as exc:
                if self.on_error is None:
                    raise
                if transient(exc):
                    return  # kept, in order, for the next flush
                self.stopped = True
                self.discard()
                self.on_error(exc)
                return
            ev.popleft()

    def _write(self, rows: list[tuple[Any, ...]], final: bool) -> None:
        try:
            self.store.insert_rows(StepRecord, [self._row_of(r) for r in rows])
        except Exception as exc:
            if self.on_error is None:
                raise
            now = self.clock()
            self._failing_since = self._failing_since or now
            self.last_write_error = str(exc)
            if transient(exc) and not final and now - self._failing_since < WRITE_GIVE_UP_S:
                keep = rows + self._unwritten  # in order, for the next write
                bound = self._buffer.maxlen or len(keep)
                if len(keep) > bound:
                    self.dropped += len(keep) - bound
                    keep = keep[-bound:]
                self._unwritten = keep
                return
            self.stopped = True
            self.discard()
            self.on_error(exc)
            return
        if self._failing_since is not None or self.dropped > self._said_dropped:
            self._note_recovered()

    def _note_recovered(self) -> None:
        """Writes resumed (or steps were dropped): one stored note that says what was lost."""
        lost, since = self.dropped - self._said_dropped, self._failing_since
        self._said_dropped, self._failing_since = self.dropped, None
        held = f" for {self.clock() - since:.1f} s" if since is not None else ""
        text = (f"the store could not be written{held} ({self.last_write_error}); "
                + (f"{lost} steps dropped past the probe's buffer of {self._buffer.maxlen}" if lost
                   else "no step lost")) if since is not None else \
            f"{lost} steps dropped: the store could not keep up"
        try:
            self.store.add_event(self.run_id, PROBE, text, {"dropped": lost,
                                                              "rank": self.rank})
        except Exception:
            pass

    def unrelay(self) -> bool:
        """`monitor run`'s process is gone (NOTE [the relay], 5): what the ring holds
        unstored goes back into the buffer, ahead of what the loop appends from now on, and
        this probe writes its own steps (the watchdog's thread). A step put while this runs
        may be lost. False when another thread did it first."""
        with self._lock:  # the watchdog's thread, or the training thread at exit
            ring, self.ring = self.ring, None
        if ring is None:
            return False
        steps: list[tuple[Any, ...]] = []
        for rec in ring.unconsumed():
            if rec[0] == DEVICE:
                step, times = as_device(rec)
                self._device_s[step] = times
            else:
                steps.append(as_step(rec))
        self._buffer.extendleft(reversed(steps))
        ring.remove()
        return True

    def flush_if_due(self) -> None:
        """Write what the loop buffered (the watchdog, every flush_interval)."""
        if self.ring is None and self.clock() - self._last_flush >= self.flush_interval:
            self.flush()

    def discard(self) -> None:
        """Drop unwritten records (after a write failed: the run goes on without them)."""
        self._buffer.clear()
        self._events.clear()
        self._unwritten = []
        self._last_flush = self.clock()
