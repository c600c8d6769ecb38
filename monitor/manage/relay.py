"""`monitor run`'s relay: the attached script's steps read from its rings (monitor/ring.py)
and written to the store from this process, not from a thread inside the user's (NOTE [the
relay] below)."""

# NOTE [the relay]
# A thread beside the training loop costs the loop each time it wakes, however little it does:
# it must take the GIL from a loop that releases it for a moment at each torch call and takes
# it straight back, and it loses those races for milliseconds to seconds while each release
# wakes it in vain (NOTE [the writer's wake] in monitor/probe/watchdog.py). Under `monitor run`
# nothing in the script's process wakes while its loop runs:
# 1. The probe puts each step into a ring it maps, one ring a process (every rank of a
#    torchrun job on this node), named in the relay's folder ($STARVATION_MONITOR_RELAY, made
#    here): two struct.pack_into calls. The ring is memory whose descriptor the probe sends
#    to this process's socket there, or else a file there (NOTE [the ring's pages] in
#    monitor/ring.py). Events go as JSON lines to a file in the folder.
# 2. This thread (in `monitor run`'s process) reads every ring each PERIOD_S, converts the
#    records to the steps table's rows and writes them with the events, many rows a
#    statement and one commit a read (a commit an event was a tenth of its CPU at an epoch
#    of 50 steps; the events file is held open). A step whose
#    CUDA events were outstanding (STEP_PENDING) waits for its device times up to HOLD_S.
#    A store that cannot be written keeps its rows, up to BOUND, then the oldest are dropped
#    and counted in one stored note; the script never waits on it.
# 3. The stall watchdog's thread in the script sleeps on a FIFO. A ring that gained no step
#    for POKE_S is poked, then again after 0.5, 1, 2, 2, ... s (POKE_MAX_S) while it gains none
#    (the loop is waiting, or in a phase not timed), and once more when steps resume, so the
#    watchdog can say a stall ended.
# 4. A script killed outright loses nothing: its records are in the ring's pages. After the
#    script ends, stop() reads every ring to its end, writes what is held and removes the
#    folder (in the system's temporary folder, not /dev/shm: the DataLoader's workers need
#    that one's room).
# 5. `monitor run` killed outright: the watchdog's thread also watches the FIFO relay.alive,
#    which this process holds open and never writes; at its end (this process gone) the
#    probe takes back what the ring holds unstored and writes its steps itself from then on,
#    as `watch()` does without `monitor run` (its watchdog's thread, every 2 s). The end is
#    seen when the dying process closes its files, after it has unmapped its memory (tens of
#    ms for a process holding torch): a script that exits inside that moment leaves its
#    last steps in a ring nobody reads.
# `watch()` in a script run without `monitor run` has no relay: its watchdog's thread writes.
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

from monitor.periodic import Periodic
from monitor.probe.writer import NO_DEVICE, TS_AT, step_row, transient
from monitor.records import PROBE, StepRecord
from monitor.ring import (
    ALIVE,
    DEVICE,
    ENV,
    REPORT,
    SOCKET,
    STEP_PENDING,
    SUFFIX,
    RingReader,
    as_device,
    as_step,
)
from monitor.store import Store

PERIOD_S = 0.25  # between reads of the rings
POKE_S = 0.5  # a ring with no new step this long: its watchdog is asked to look
POKE_MAX_S = 2.0  # ... then again after twice as long each time, up to this (an untimed
# phase, an evaluation loop, wakes the script's thread no more often than this)
HOLD_S = 2.0  # a step awaiting its device times is written without them after this
BOUND = 200_000  # rows held while the store cannot be written; older ones dropped



class _Ring:
    """One ring's reader and what the relay holds for it."""

    def __init__(self, reader: RingReader) -> None:
        self.reader = reader
        self.pending: dict[int, tuple[float, tuple[Any, ...]]] = {}  # step -> (read at, rec)
        self.device: dict[int, tuple[Any, ...]] = {}  # step -> DEVICE record, before its step
        self.changed = time.monotonic()  # when it last gained a step
        self.poked = 0.0
        self.every = POKE_S  # the wait before the next poke while it gains no step
        self.idle = False  # poked since its last step: poke once more when steps resume


class Relay:
    """Reads the rings of one run's processes into the store, on a thread of its own."""

    def __init__(self, store_path: Any, run_id: int) -> None:
        self.store_path, self.run_id = store_path, run_id
        self.folder = tempfile.mkdtemp(prefix="starvation-relay-")
        self.rings: dict[str, _Ring] = {}
        self.held: list[tuple[Any, ...]] = []  # rows the store has not taken yet
        self.events: list[tuple[float, str, str, Any]] = []
        self.dropped = 0
        self._said_dropped = 0
        self.failing: str | None = None  # the store's error while it cannot be written
        self.stopped: str | None = None  # why it gave up (a store that cannot be written)
        self.errors = 0
        self._loop = Periodic("starvation-relay", self.cycle, PERIOD_S)
        self.store: Store | None = None
        self._alive: int | None = None
        self._sock: socket.socket | None = None  # where rings in memory arrive

    def env(self) -> dict[str, str]:
        return {ENV: self.folder}

    def start(self) -> Relay:
        """Before the script starts: the FIFO its probes watch for this process's end
        (NOTE [the relay], 5), held open for as long as the relay reads."""
        path = os.path.join(self.folder, ALIVE)
        os.mkfifo(path, 0o600)
        self._alive = os.open(path, os.O_RDWR)  # never written; not inherited (PEP 446)
        if hasattr(socket, "recv_fds"):  # else (or a path too long to bind) rings are files
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.bind(os.path.join(self.folder, SOCKET))
                sock.setblocking(False)
                self._sock = sock
            except OSError:
                sock.close()
        self._loop.start()
        return self

    def stop(self) -> int:
        """The script has ended: every ring read to its end, what is held written, the
        folder removed. Returns how many steps could not be stored (the store refused them
        to the end: `monitor run` says so)."""
        self._loop.stop(30)
        try:
            self.cycle(final=True)
        finally:
            for r in self.rings.values():
                with contextlib.suppress(Exception):
                    r.reader.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            if self.store is not None:
                self.store.close()
            if self._alive is not None:
                os.close(self._alive)
            if self._sock is not None:
                self._sock.close()
        return len(self.held) + self.dropped - self._said_dropped

    def cycle(self, final: bool = False) -> None:
        """One read of every ring; the rows and events written (kept where the store
        refuses them). Never raises: the relay's errors cannot touch the script."""
        if self.stopped is not None:
            return
        try:
            if self.store is None:
                self.store = Store(self.store_path)
            self._open_new()
            now = time.monotonic()
            for ring in self.rings.values():
                self._read(ring, now, final)
            self._write()
        except Exception:
            self.errors += 1

    def _open_new(self) -> None:
        self._receive()
        for entry in os.scandir(self.folder):
            if entry.name.endswith(SUFFIX) and entry.path not in self.rings:
                try:
                    self.rings[entry.path] = _Ring(RingReader(entry.path))
                except (OSError, ValueError):  # still being made: next cycle
                    continue

    def _receive(self) -> None:
        """The rings in memory whose descriptors wait in the socket (NOTE [the ring's pages]
        in monitor/ring.py), each under its name in the folder."""
        while self._sock is not None:
            try:
                name, fds, _, _ = socket.recv_fds(self._sock, 256, 4)
            except OSError:  # BlockingIOError: none waits
                return
            for extra in fds[1:]:
                os.close(extra)
            if not fds:
                continue
            path = os.path.join(self.folder, os.path.basename(name.decode(errors="replace")))
            if not path.endswith(SUFFIX) or path in self.rings:  # not a new ring's name
                os.close(fds[0])
                continue
            with contextlib.suppress(OSError, ValueError):  # RingReader closes the fd
                self.rings[path] = _Ring(RingReader(path, fd=fds[0]))

    def _read(self, ring: _Ring, now: float, final: bool) -> None:
        r = ring.reader
        recs, lost = r.read()
        self.dropped += lost
        self.events += r.events()
        steps = 0
        for rec in recs:
            step = rec[1]
            if rec[0] == DEVICE:
                held = ring.pending.pop(step, None)
                if held is None:
                    ring.device[step] = rec
                else:
                    self.held.append(self._row(r, held[1], rec))
                continue
            steps += 1
            dev = ring.device.pop(step, None)
            if rec[0] == STEP_PENDING and dev is None:
                ring.pending[step] = (now, rec)
            else:
                self.held.append(self._row(r, rec, dev))
        late = final or r.closed()
        for step, (at, rec) in list(ring.pending.items()):
            if late or now - at >= HOLD_S:
                del ring.pending[step]
                self.held.append(self._row(r, rec, None))
        if len(ring.device) > 4 * 1024:  # device times whose step never came
            ring.device.clear()
        self._poke(ring, now, steps, final or r.closed())

    def _poke(self, ring: _Ring, now: float, steps: int, over: bool) -> None:
        if steps:
            ring.changed, ring.every = now, POKE_S
            if ring.idle:  # steps resumed after a stall looked for: let it say so
                ring.idle = False
                ring.reader.poke()
            return
        if not over and now - ring.changed >= POKE_S and now - ring.poked >= ring.every:
            if ring.idle:  # the last poke found it idle too: wait longer for the next
                ring.every = min(POKE_MAX_S, ring.every * 2)
            ring.poked, ring.idle = now, True
            ring.reader.poke()

    def _row(self, r: RingReader, rec: tuple[Any, ...], dev: tuple[Any, ...] | None
             ) -> tuple[Any, ...]:
        """A step record as the steps table's row (StepRecord's columns): device phases
        where the device clock timed it, else the host's (a row never mixes the two; as
        monitor/probe/writer.py's _row_of)."""
        step = as_step(rec)
        return step_row(self.run_id, r.rank, step, r.wall(step[TS_AT]),
                        as_device(dev)[1] if dev is not None else NO_DEVICE)

    def _write(self) -> None:
        store = self.store
        assert store is not None
        try:
            if self.events or self.held:
                with store.batch():  # one commit: all of them, or none and all kept
                    for ts, kind, label, data in self.events:
                        if kind == REPORT:  # a rank's report: its row, and the run's record
                            store.set_rank(self.run_id, **data["ranks"])
                            if data.get("run"):
                                store.update_run(self.run_id, **data["run"])
                        else:
                            store.add_event(self.run_id, kind, label, data, ts=ts)
                    store.insert_rows(StepRecord, self.held)
                self.events, self.held = [], []
        except Exception as exc:
            self.failing = self.failing or str(exc)
            if not transient(exc):  # deleted, replaced, corrupt: it will not pass
                self._give_up(exc)
                return
            if len(self.held) > BOUND:
                self.dropped += len(self.held) - BOUND
                self.held = self.held[-BOUND:]
            return
        for ring in self.rings.values():
            ring.reader.mark_consumed(ring.reader.tail - len(ring.pending))
        if self.failing is not None or self.dropped > self._said_dropped:
            self._note()

    def _give_up(self, exc: Exception) -> None:
        """The store cannot be written for good: said once, as the probe says it (the
        training goes on); nothing more is held or written."""
        if self.stopped is None:
            self.stopped = str(exc)
            print(f"starvation-monitor: recording stopped: {exc}. Your training goes on; its "
                  "steps are no longer recorded.", file=sys.stderr, flush=True)
        self.held, self.events = [], []

    def _note(self) -> None:
        """Writes resumed, or steps were lost: one stored note that says what."""
        lost, why = self.dropped - self._said_dropped, self.failing
        self._said_dropped, self.failing = self.dropped, None
        text = (f"the store could not be written for a while ({why}); " if why else "") + (
            f"{lost} steps dropped: the relay could not keep up" if lost else "no step lost")
        with contextlib.suppress(Exception):
            assert self.store is not None
            self.store.add_event(self.run_id, PROBE, text, {"dropped": lost})
