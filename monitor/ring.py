"""The relay ring: how an attached script's steps leave its process under `monitor run`
without a thread beside the training loop (NOTE [the relay] in monitor/manage/relay.py).

The probe (monitor/probe/timing.py) writes each step as one fixed-size record into the
memory it maps, then bumps the header's count: two `struct.pack_into` calls, no lock, no
system call, no store, no thread. `monitor run`'s own process maps the same memory (NOTE
[the ring's pages]), reads what was added, and writes the rows to the store. A record is
a kind slot and one 8-byte slot per field of STEP_FIELDS (monitor/records.py: the layout and
the per-step `put` are made from that list); a None is NaN (a time) or -1 (a count). The
ring wraps: a reader more than CAPACITY records behind loses the oldest, counted (the writer
never waits). Events (rare: a loader report, a probe note) are JSON lines appended to
`<ring>.events`; the reader asks the probe's watchdog thread to look for a stall by writing
a byte to the FIFO `<ring>.poke`, on which that thread sleeps, waking for nothing else.
Standard library only, and monitor/records.py (the probe imports it: its fence).
(NOTE [the ring's pages] below.)"""

# NOTE [the ring's pages]
# A ring that is a file on a disk's filesystem (the temporary folder is one, often) costs the
# loop a page fault each time a step's record reaches a page the loop has not written since
# the kernel last wrote the page back: ~40 a second in a 1 ms loop (a 4 KiB page holds 36
# records), and each one tens of µs on a virtual machine, which was a third of what the
# probe cost that loop (docs/benchmarks.md). A sparse file is worse: a full disk makes the
# next page a SIGBUS that kills the training process. So the ring is made in memory
# (memfd_create), its pages all made when it is (MAP_POPULATE), and its descriptor sent to
# the relay's datagram socket: a message in the socket's queue holds the ring even if the
# script is killed before the relay reads it. Not /dev/shm: the DataLoader's workers need
# its room, and the product measures it. Where that cannot be (no memfd, no socket, Python
# before 3.9), the ring is a file with its blocks reserved up front (posix_fallocate: a full
# disk is an error when the ring is made, and the probe writes from its own thread).

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import socket
import struct
import time
from typing import Any

from monitor.records import PHASES_AT, STEP_AT, STEP_FIELDS

ENV = "STARVATION_MONITOR_RELAY"  # the folder `monitor run` reads the rings from
CAPACITY = 65_536  # records a ring holds (a 1 ms loop's 65 s): 7 MB, sparse until written
MAGIC = b"SMRING01"
# header: magic, capacity, head (records written), consumed (the reader's: written to the
# store), closed (the writer's last record is in), pid, rank, anchor clock, anchor wall
HEADER = struct.Struct("<8sqqqqqqdd")
HEADER_SIZE = 128
HEAD_AT, CONSUMED_AT, CLOSED_AT = 16, 24, 32
COUNT = struct.Struct("<q")
# a record: its kind, then STEP_FIELDS in their order (ts on the probe's clock). A DEVICE
# record carries a step's device times in the same slots: the idle time in ts, the span in
# wait_s, whether phases were marked in held (1), the phases in theirs.
RECORD = struct.Struct("<q" + "".join("q" if f.integer else "d" for f in STEP_FIELDS))
STEP, DEVICE, STEP_PENDING = 0, 1, 2  # a step; a step's device times; a step awaiting them
NAN = math.nan
SUFFIX, EVENTS, POKE = ".ring", ".events", ".poke"
SOCKET = "relay.sock"  # the relay's datagram socket: rings in memory arrive there
POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux, Python 3.10+: every page made at once
ALIVE = "relay.alive"  # a FIFO the relay holds open for writing and never writes: a probe
# reading it meets its end only when `monitor run`'s process is gone
REPORT = "rank report"  # an event line that is a rank's report: {"ranks": set_rank's keywords,
# "run": update_run's or None} (monitor/probe/recorder.py), written by the relay as such


def _t(x: float) -> float | None:
    return None if x != x else x  # NaN: None


_NULL_INT = tuple(i + 1 for i, f in enumerate(STEP_FIELDS) if f.integer and f.nullable)
_NULL_FLOAT = tuple(i + 1 for i, f in enumerate(STEP_FIELDS) if not f.integer and f.nullable)


def as_step(rec: tuple[Any, ...]) -> tuple[Any, ...]:
    """A step record as the probe's tuple holds a step (STEP_FIELDS' order), None where the
    ring has NaN or -1."""
    out = list(rec)
    for i in _NULL_INT:
        if out[i] < 0:
            out[i] = None
    for i in _NULL_FLOAT:
        if out[i] != out[i]:
            out[i] = None
    return tuple(out[1:])


_TS, _WAIT, _HELD = STEP_AT["ts"] + 1, STEP_AT["wait_s"] + 1, STEP_AT["held"] + 1
_PH = PHASES_AT + 1


def as_device(rec: tuple[Any, ...]) -> tuple[int, tuple[Any, ...]]:
    """A DEVICE record as (step, (idle, span, its phases or None)): DeviceClock.harvest's."""
    phases = tuple(_t(x) for x in rec[_PH:_PH + 3]) if rec[_HELD] == 1 else None
    return rec[STEP_AT["step"] + 1], (_t(rec[_TS]), rec[_WAIT], phases)


def _put_source() -> str:
    """RingWriter.put's code, made from STEP_FIELDS (as namedtuple makes its own): one
    unpacking of the probe's tuple and one pack_into, each None as the ring's NaN or -1;
    no loop and no *args on the training thread's path."""
    names = [f.name for f in STEP_FIELDS]
    slots = [f"(-1 if {f.name} is None else {f.name})" if f.integer and f.nullable else
             f"(NAN if {f.name} is None else {f.name})" if f.nullable else f.name
             for f in STEP_FIELDS]
    return (f"def put(self, kind, rec):\n"
            f"    {', '.join(names)}, = rec\n"
            f"    head = self.head\n"
            f"    RECORD.pack_into(self.mm, HEADER_SIZE + (head % self.capacity) * RECORD.size,"
            f" kind, {', '.join(slots)})\n"
            f"    self.head = head = head + 1\n"
            f"    COUNT.pack_into(self.mm, HEAD_AT, head)  # after the record: the signal\n")


def _made_put() -> Any:
    space: dict[str, Any] = {"RECORD": RECORD, "HEADER_SIZE": HEADER_SIZE, "NAN": NAN,
                             "COUNT": COUNT, "HEAD_AT": HEAD_AT}
    exec(compile(_put_source(), "<monitor.ring put>", "exec"), space)
    put = space["put"]
    put.__doc__ = ("The per-step call: `rec`, the probe's tuple in STEP_FIELDS' order, as "
                   "one record of `kind`, then the head count (the reader's signal).")
    return put


# a DEVICE record's slots before its step's times go in: no value anywhere
_DEVICE = [DEVICE] + [(-1 if f.nullable else 0) if f.integer else (NAN if f.nullable else 0.0)
                      for f in STEP_FIELDS]


class RingWriter:
    """The probe's half, in the training process. `put` is the per-step call."""

    def __init__(self, folder: str, rank: int, anchor_clock: float, anchor_wall: float,
                 capacity: int = CAPACITY) -> None:
        # the ring's name: a file of that name only where it cannot be in memory (_shared)
        self.path = os.path.join(folder, f"{os.getpid()}-{rank}{SUFFIX}")
        self.capacity = capacity
        size = HEADER_SIZE + capacity * RECORD.size
        header = HEADER.pack(MAGIC, capacity, 0, 0, 0, os.getpid(), rank, anchor_clock,
                             anchor_wall)
        self.mm = self._shared(folder, size, header) or self._file(size, header)
        self.events_fd = os.open(self.path[:-len(SUFFIX)] + EVENTS,
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        poke = self.path[:-len(SUFFIX)] + POKE
        os.mkfifo(poke, 0o600)
        # read-write: the open never blocks, and the watchdog's read never sees an end
        self.poke_fd = os.open(poke, os.O_RDWR)
        try:  # read-only, no wait: EOF there is the relay's process gone
            self.alive_fd: int | None = os.open(os.path.join(folder, ALIVE),
                                                os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self.alive_fd = None
        self.head = 0

    def _shared(self, folder: str, size: int, header: bytes) -> mmap.mmap | None:
        """The ring in memory (a memfd, its pages made up front) handed to the relay through
        its socket (NOTE [the ring's pages]); None where this system or relay has no way
        to (the ring is then a file)."""
        sock = os.path.join(folder, SOCKET)
        if not (hasattr(os, "memfd_create") and hasattr(socket, "send_fds")
                and os.path.exists(sock)):
            return None
        mm = None
        try:
            fd = os.memfd_create("starvation-ring", os.MFD_CLOEXEC)
        except OSError:  # the open-files limit: the file will say so, or be made
            return None
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | POPULATE)
            mm[:HEADER.size] = header
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.setblocking(False)  # a relay whose queue is full: the file instead
                s.connect(sock)  # (send_fds takes no address)
                socket.send_fds(s, [os.path.basename(self.path).encode()], [fd])
            return mm
        except OSError:
            if mm is not None:
                mm.close()
            return None
        finally:
            os.close(fd)

    def _file(self, size: int, header: bytes) -> mmap.mmap:
        """The ring as a file in the relay's folder, its blocks reserved (a full disk is an
        error here, never a SIGBUS in the loop at a later page)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | POPULATE)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        os.close(fd)
        mm[:HEADER.size] = header  # last: the reader takes the file once it has the magic
        return mm

    put = _made_put()

    def put_device(self, step: int, idle: float | None, span: float,
                   phases: tuple[float | None, ...] | None) -> None:
        """A step's device times, harvested after the step was put (STEP_PENDING), in the
        slots RECORD's comment names."""
        v = _DEVICE.copy()
        v[STEP_AT["step"] + 1], v[_TS], v[_WAIT] = step, NAN if idle is None else idle, span
        v[_HELD] = 1 if phases is not None else 0
        v[_PH:_PH + 3] = [NAN if x is None else x for x in (phases or (None, None, None))]
        head = self.head
        RECORD.pack_into(self.mm, HEADER_SIZE + (head % self.capacity) * RECORD.size, *v)
        self.head = head = head + 1
        COUNT.pack_into(self.mm, HEAD_AT, head)

    def event(self, ts: float, kind: str, label: str, data: dict[str, Any] | None) -> None:
        """One event line (one write, no store); OSError when it cannot be written (the
        probe then hands it to the store)."""
        line = json.dumps([ts, kind, label, data], default=str) + "\n"
        os.write(self.events_fd, line.encode())

    def relay_gone(self) -> bool:
        """Whether `monitor run`'s process has ended (its end of relay.alive is closed)."""
        if self.alive_fd is None:
            return False
        try:
            return not os.read(self.alive_fd, 64)  # non-blocking: b"" is the end
        except OSError:  # BlockingIOError: open, nothing written: it lives
            return False

    def consumed(self) -> int:
        return COUNT.unpack_from(self.mm, CONSUMED_AT)[0]

    def wait_consumed(self, timeout: float) -> bool:
        """Whether the reader has stored every record put so far (an epoch's end, before an
        autotuner reads it), waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        while self.consumed() < self.head:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def unconsumed(self) -> list[tuple[Any, ...]]:
        """The records the reader has not stored (its process is gone), oldest first."""
        start = max(self.consumed(), self.head - self.capacity)
        return [RECORD.unpack_from(self.mm, HEADER_SIZE + (i % self.capacity) * RECORD.size)
                for i in range(start, self.head)]

    def remove(self) -> None:
        """The ring's files, and the relay's folder if nothing else is in it (its process
        is gone and will not)."""
        base = self.path[:-len(SUFFIX)]
        folder = os.path.dirname(self.path)
        for f in (self.path, base + EVENTS, base + POKE, os.path.join(folder, ALIVE),
                  os.path.join(folder, SOCKET)):
            try:
                os.unlink(f)
            except OSError:
                pass
        try:
            os.rmdir(folder)
        except OSError:  # another rank's ring is still there
            pass

    def close(self) -> None:
        """The last record is in: the reader writes what it holds without waiting more."""
        try:
            COUNT.pack_into(self.mm, CLOSED_AT, 1)
        except ValueError:  # closed already
            pass


class RingReader:
    """`monitor run`'s half: the records one ring gained since the last read."""

    def __init__(self, path: str, fd: int | None = None) -> None:
        """The ring named `path`: the file there, or `fd` (a memfd from the relay's socket,
        closed here)."""
        self.path = path
        fd = os.open(path, os.O_RDWR) if fd is None else fd
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise ValueError(f"{path}: not a ring yet")
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, cap, _, _, _, pid, rank, a_clock, a_wall = HEADER.unpack_from(self.mm, 0)
        if magic != MAGIC or size < HEADER_SIZE + cap * RECORD.size:
            self.mm.close()
            raise ValueError(f"{path}: not a ring yet")
        self.capacity, self.pid, self.rank = cap, pid, rank
        self.anchor_clock, self.anchor_wall = a_clock, a_wall
        self.tail = 0
        self._events_fd: int | None = None
        self._partial = b""

    def head(self) -> int:
        return COUNT.unpack_from(self.mm, HEAD_AT)[0]

    def closed(self) -> bool:
        return COUNT.unpack_from(self.mm, CLOSED_AT)[0] == 1

    def wall(self, t: float) -> float:
        return self.anchor_wall + (t - self.anchor_clock)

    def read(self) -> tuple[list[tuple[Any, ...]], int]:
        """(the records added since the last read, oldest first; how many were lost: the
        writer lapped the reader)."""
        head, start, cap = self.head(), self.tail, self.capacity
        lost = max(0, head - cap - start)
        start += lost
        recs = [RECORD.unpack_from(self.mm, HEADER_SIZE + (i % cap) * RECORD.size)
                for i in range(start, head)]
        torn = max(0, self.head() - cap - start)  # overwritten while being read
        if torn:
            recs, lost = recs[torn:], lost + torn
        self.tail = head
        return recs, lost

    def mark_consumed(self, upto: int) -> None:
        COUNT.pack_into(self.mm, CONSUMED_AT, upto)

    def events(self) -> list[tuple[float, str, str, dict[str, Any] | None]]:
        """The event lines appended since the last read (a line not yet whole waits)."""
        try:  # (held open once there: an open a cycle was most of a read)
            if self._events_fd is None:
                self._events_fd = os.open(self.path[:-len(SUFFIX)] + EVENTS, os.O_RDONLY)
        except OSError:  # not made yet
            return []
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := os.read(self._events_fd, 1 << 16):
                chunks.append(chunk)
        data = b"".join(chunks)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out = []
        for line in lines:
            try:
                ts, kind, label, payload = json.loads(line)
                out.append((float(ts), str(kind), str(label), payload))
            except (ValueError, TypeError):
                continue
        return out

    def poke(self) -> bool:
        """Wake the probe's watchdog (look for a stall); False when nothing listens."""
        try:
            fd = os.open(self.path[:-len(SUFFIX)] + POKE, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            os.write(fd, b"!")
        except OSError:  # the pipe is full: it has a wake waiting already
            pass
        finally:
            os.close(fd)
        return True

    def close(self) -> None:
        self.mm.close()
        if self._events_fd is not None:
            os.close(self._events_fd)
            self._events_fd = None
