"""The stall watchdog, beside the training loop (the managed workload and the attach probe).

A named daemon thread checks once a second how long the loop has waited for its next batch.
Past `stall_limit_s` (at least 10 s, and 20 typical steps; for an epoch's first batch the
start-up allowance, which needs no history) it records one `stalled` event
with what it can see: whether the main thread is inside the dataset (and where), and each
DataLoader worker's state and CPU. When batches come again it records `resumed`. It also
writes the probe's buffered steps, so a loop stuck mid-epoch still shows its last steps. It
never stops the training: a slow loader is reported, not killed (NOTE [shutdown protocol] in
monitor/manage/runtime.py says who stops what).
"""
from __future__ import annotations

import os
import select
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from monitor.periodic import Periodic
from monitor.probe.timing import Probe
from monitor.probe.untimed import named as untimed_named
from monitor.records import LOOP_ENDED, RESUMED, STALLED
from monitor.thresholds import stall_limit_s

TORCH_DATA = os.path.join("torch", "utils", "data")
# NOTE [the writer's wake]
# Every wake of this thread costs the training loop more than the
# work it does. To run, the thread must take the GIL from a loop that releases it for a
# moment at each torch call and takes it straight back; the waker loses those races (CPython's
# convoy effect) for 2 ms to 1.6 s on the 2-core box, and meanwhile each of the loop's releases
# wakes it in vain: a 1 ms step's DataLoader next() took 17-19 µs instead of 10-11 while it
# waited (bench/probe_wake.py). So it wakes every `interval` while the run is young (the
# page's first verdict needs its first steps at once), then every `steady` seconds.
RELAY_GONE = "monitor run's process is gone: this process writes its own steps from now on"
FLUSH_ALONE_S = 2.0  # the writer's period once `monitor run`'s process is gone (the relay's)
YOUNG_S = 15.0  # seconds of a run written every `interval`; later every `steady`


def where_is_main(thread_id: int | None) -> str:
    """Where the main thread is: inside the dataset's code (file:line), waiting for
    DataLoader workers, or elsewhere."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    in_loader = False
    user: str | None = None
    while frame is not None:
        path = frame.f_code.co_filename
        if TORCH_DATA in path:
            in_loader = True
            if "_utils" + os.sep + "fetch.py" in path:
                return f"the main process is inside the dataset at {user}" if user \
                    else "the main process is inside the dataset"
            if frame.f_code.co_name in ("_get_data", "_try_get_data"):
                return "the main process is waiting for DataLoader workers"
        elif user is None and "site-packages" not in path and "monitor" + os.sep not in path:
            user = f"{os.path.basename(path)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "the main process is inside the loader" if in_loader else \
        f"the main process is at {user or 'an unknown place'}"


STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "Z": "zombie", "T": "stopped",
          "t": "tracing-stop", "X": "dead", "I": "idle", "P": "parked", "W": "waking"}


def _stat(pid: int, proc: str = "/proc") -> tuple[int, str, int] | None:
    """(parent pid, state letter, CPU ticks user+system) from /proc/PID/stat, or None."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()  # the name, in parentheses, may hold spaces
    try:
        return int(rest[1]), rest[0], int(rest[11]) + int(rest[12])
    except (IndexError, ValueError):
        return None


def children(pid: int, proc: str = "/proc") -> list[int]:
    """This process's children (its DataLoader workers), from /proc: the standard library
    only, since the probe runs in the user's environment."""
    kids: list[int] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return kids
    for name in names:
        if name.isdigit():
            st = _stat(int(name), proc)
            if st is not None and st[0] == pid:
                kids.append(int(name))
    return sorted(kids)


def workers_state(pid: int, interval: float = 0.1, proc: str = "/proc") -> list[dict[str, Any]]:
    """This process's children: pid, state and CPU % over `interval` (one wait for all)."""
    kids = children(pid, proc)
    if not kids:
        return []
    first = {k: _stat(k, proc) for k in kids}
    time.sleep(interval)  # sleep-ok: the CPU reading's own interval, on the watchdog thread
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = []
    for k in kids:
        a, b = first[k], _stat(k, proc)
        if a is None or b is None:
            out.append({"pid": k, "status": "gone", "cpu_pct": None})
            continue
        out.append({"pid": k, "status": STATES.get(b[1], b[1]),
                    "cpu_pct": round(100.0 * (b[2] - a[2]) / hz / interval, 1)})
    return out


def describe(idle_s: float, main: str, workers: list[dict[str, Any]],
             first: bool = False, limits: str | None = None) -> str:
    what = "no first batch after" if first else "no batch for"
    text = f"{what} {idle_s:.0f} s: the loader looks stuck; {main}"
    if workers:
        text += "; workers " + ", ".join(
            f"{w['pid']} ({w['status']}, {w['cpu_pct'] if w['cpu_pct'] is not None else '?'}%"
            " CPU)" for w in workers)
    return text + (f". {limits}" if limits else "")


FD_NEAR = 0.9  # descriptors open past this share of `ulimit -n`: the likely cause of a hang


def _fds(pid: str) -> tuple[int, int] | None:
    """(descriptors open, the soft open-files limit) of a process, from /proc."""
    try:
        n = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/limits") as f:
            row = next(ln for ln in f if ln.startswith("Max open files"))
        soft = row.split()[3]
        return n, (int(soft) if soft.isdigit() else 0)
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def near_limits(workers: list[dict[str, Any]] | None = None) -> str | None:
    """A limit the stuck loader is at: the open-files limit, of the main process or of a
    worker (torch's file_descriptor sharing holds one per tensor in flight; at the limit a
    worker cannot send its batch, 'Too many open files' goes to its own stderr, and the loop
    waits for ever)."""
    worst = None
    for pid in ["self", *(str(w["pid"]) for w in workers or ())]:
        got = _fds(pid)
        if got is not None and got[1] > 0 and got[0] >= FD_NEAR * got[1] and (
                worst is None or got[0] / got[1] > worst[1] / worst[2]):
            worst = ("the main process" if pid == "self" else f"worker {pid}", *got)
    if worst is None:
        return None
    who, n, soft = worst
    return (f"Open files: {who} holds {n} of its ulimit -n {soft}: torch's file_descriptor "
            "sharing holds one per tensor in flight, and at the limit a worker cannot send "
            "its batch ('Too many open files'): raise ulimit -n, or call torch.multiprocessing"
            ".set_sharing_strategy('file_system'), or collate fewer tensors a batch")


TRUE = ("1", "true", "yes", "on")


def _cmdline(pid: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def forked_pool(workers: list[dict[str, Any]] | None) -> str | None:
    """The workers hang at their first batch because the parent's thread pool was copied
    into them mid-use: HF tokenizers' (a fast tokenizer's Rust pool) run in the parent with
    TOKENIZERS_PARALLELISM on, then the DataLoader forked. The library disables its pool
    in a forked child where the variable is unset; set on, it deadlocks at the first encode
    (tests/scripts/causes.py tokenizer). The signature: workers forked (their command line
    is the parent's: not spawn, not forkserver), every one asleep at ~0% CPU."""
    par = os.environ.get("TOKENIZERS_PARALLELISM", "")
    if "tokenizers" not in sys.modules or par.strip().lower() not in TRUE or not workers:
        return None
    if any(w.get("status") != "sleeping" or (w.get("cpu_pct") or 0.0) > 1.0 for w in workers):
        return None
    mine = _cmdline("self")
    forked = [w for w in workers if mine is not None and _cmdline(str(w["pid"])) == mine]
    if len(forked) < len(workers):
        return None
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 0
    return (f"Tokenizers after fork: the script imported `tokenizers` with "
            f"TOKENIZERS_PARALLELISM={par} and its {len(forked)} DataLoader workers were "
            f"forked from a process of {threads} threads, and sleep at 0% CPU: a fast "
            "tokenizer's thread pool used in the parent before the fork deadlocks in a "
            "forked worker at its first encode. Set TOKENIZERS_PARALLELISM=false before the "
            "loader starts (or tokenize only inside the workers, or "
            "multiprocessing_context='spawn')")


class Watchdog:
    """Watches one Probe. `on_stall(text)` is called once per stall (the attach probe prints
    it to stderr)."""

    def __init__(self, probe: Probe, interval: float = 1.0,
                 on_stall: Callable[[str], None] | None = None,
                 main_thread: int | None = None, steady: float | None = None,
                 poke_fd: int | None = None) -> None:
        self.probe, self.interval, self.on_stall = probe, interval, on_stall
        # under the relay: the FIFO this thread sleeps on, woken only by `monitor run` (a
        # loop that stopped delivering steps) or by stop(): no wake beside a running loop
        self.poke_fd = poke_fd
        self.steady = steady  # the period once the run is YOUNG_S old (NOTE above)
        self._born = probe.clock()
        self.main_thread = main_thread if main_thread is not None else threading.get_ident()
        self.stalled = False
        self.errors = 0
        self.on_launcher_gone: Callable[[], Any] | None = None  # NOTE [bound to monitor run]
        # monitor/periodic.py: on its timer, or first asleep on the FIFO (_relayed)
        self._loop = Periodic("starvation-watchdog", self._tick, self.period,
                              before=lambda: self.poke_fd is None or self._relayed(),
                              finish=self.probe.store.close, wake=self._poke)

    def start(self) -> Watchdog:
        self._loop.start()
        return self

    def _poke(self) -> None:
        if self.poke_fd is not None:
            try:
                os.write(self.poke_fd, b"x")
            except OSError:
                pass

    def stop(self) -> None:
        """Stop watching; a stall still open is closed (the loop is over)."""
        self._loop.stop(5)
        if self.stalled:
            self.stalled = False
            try:
                self.probe.store.add_event(self.probe.run_id, RESUMED, LOOP_ENDED, None)
            except Exception:
                self.errors += 1

    def period(self) -> float:
        """Seconds to the next wake: `interval` while the run is young, then `steady`, the
        probe's flush interval with it (NOTE [the writer's wake])."""
        if self.steady is not None and self.interval != self.steady and \
                self.probe.clock() - self._born >= YOUNG_S:
            self.interval = self.probe.flush_interval = self.steady
        return self.interval

    def _tick(self) -> None:
        try:
            self.check()
        except Exception:  # a store that cannot be written is the writer's to report
            self.errors += 1

    def _relayed(self) -> bool:
        """Under the relay: asleep, the GIL released, until `monitor run` pokes (a ring
        that stopped gaining steps) or stop(). False when stopped; True when `monitor run`'s
        process is gone: the probe then writes its own steps (NOTE [the relay], 5) and this
        thread wakes on its timer from then on."""
        ring = self.probe.ring
        fds = [self.poke_fd] + ([ring.alive_fd] if ring.alive_fd is not None else [])
        while True:
            try:
                ready = select.select(fds, [], [])[0]
            except OSError:
                return False
            if ring.alive_fd in ready and not os.read(ring.alive_fd, 64):
                self.poke_fd = None
                try:
                    self.steady = self.interval = self.probe.flush_interval = FLUSH_ALONE_S
                    if self.probe.unrelay() and self.on_stall is not None:
                        self.on_stall(RELAY_GONE)
                except Exception:
                    self.errors += 1
                if self.on_launcher_gone is not None:
                    self.on_launcher_gone()
                return True
            if self._loop.stopping:
                return False
            try:
                os.read(self.poke_fd, 64)
                self.check()
            except Exception:  # a store that cannot be written is the writer's to report
                self.errors += 1

    def limit(self, first: bool | None = None) -> float:
        p = self.probe
        steps = list(p.recent_steps)
        return stall_limit_s(statistics.median(steps) if steps else None,
                             p.waiting_first if first is None else first, p.first_batch_s)

    def check(self) -> None:
        p = self.probe
        p.flush_if_due()
        since, first, loader = p.waiting_since, p.waiting_first, None
        untimed = p.untimed  # (NOTE [an untimed loader's stall] in monitor/probe/untimed.py)
        if since is None and untimed is not None:
            since, first, loader = untimed
        idle = p.clock() - since if since is not None else 0.0
        if not self.stalled and since is not None and idle >= self.limit(first):
            self.stalled = True
            workers = workers_state(os.getpid())
            text = describe(idle, where_is_main(self.main_thread), workers,
                            first=first and (loader is not None or p.first_batch_s is None),
                            limits=near_limits(workers) or forked_pool(workers))
            if loader is not None:
                text = untimed_named(loader, text)
            p.store.add_event(p.run_id, STALLED, text, {
                "waiting_since": p.wall(since), "workers": workers,
                "limit_s": self.limit(first), "loader": loader})
            if self.on_stall is not None:
                self.on_stall(text)
        elif self.stalled and (since is None or idle < self.limit(first)):
            self.stalled = False
            p.store.add_event(p.run_id, RESUMED, "batches again", None)
