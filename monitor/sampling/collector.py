"""The sampler: host (psutil) and GPU (NVML) readings on a drift-free schedule, written to the
store in batches (one transaction per `flush_interval`).

`Collector` samples in a thread of the process that owns it (the CLI, attached runs, tests).
The dashboard runs it in a process of its own instead (`CollectorProcess`, `python -m
monitor.sampling.collector`): page rendering holds the dashboard's interpreter for most of each
second with a few tabs open, and a sampling thread there fell to 1.6-3.8 passes/s with gaps
of 3 s. The process learns which workload to follow from the store (`follow`), exits when its
parent does, and stops on SIGTERM after a last flush.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable

from monitor.periodic import Periodic
from monitor.records import GpuSample, GpuUtilSample, HostSample
from monitor.sampling.gpu import GpuBackend, open_backend
from monitor.sampling.host import HostSampler
from monitor.store import Store


class Collector:
    """A named daemon thread sampling every `interval` seconds until `stop()`."""

    def __init__(
        self,
        store: Store,
        host: HostSampler | None = None,
        gpu: GpuBackend | None = None,
        interval: float = 0.25,
        flush_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.host = host or HostSampler()
        self.gpu = gpu if gpu is not None else open_backend()
        self.interval = interval
        self.flush_interval = flush_interval
        self.clock = clock
        self.errors = 0
        self.last_error: str | None = None
        self._loop = Periodic("starvation-collector", self._tick, lambda: self.interval,
                              at_once=True, finish=self.store.close, clock=clock)
        self._last_flush = clock()
        self._host_buf: list[HostSample] = []
        self._gpu_buf: list[GpuSample] = []
        self._util_buf: list[GpuUtilSample] = []
        self.last_pass_s: float | None = None  # cost of the last sampling pass
        self._inventory: tuple | None = None  # what the store last heard about the GPUs
        self._run_id: int | None = None

    def follow(self, pid: int | None, run_id: int | None) -> None:
        """Follow this workload's process tree (None: host only)."""
        self._run_id = run_id
        self.host.follow(pid, run_id)
        self.gpu.follow_pids({pid} if pid is not None else set())

    def start(self) -> Collector:
        try:
            self.publish_inventory()
        except Exception as exc:  # a store another writer holds locked: the loop publishes
            self.errors += 1      # it at its next flush (a dead `monitor run` once, here)
            self.last_error = f"inventory: {type(exc).__name__}: {exc}"
        self._last_flush = self.clock()
        self._loop.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._loop.stop(timeout)
        self.flush()

    def sample_once(self) -> None:
        t0 = time.perf_counter()
        try:
            self._host_buf.extend(self.host.sample_all())
        except Exception as exc:  # a bad reading is one lost row, not a dead loop
            self.errors += 1
            self.last_error = f"host: {type(exc).__name__}: {exc}"
        try:
            gpass = self.gpu.sample()
            self._gpu_buf.extend(gpass.samples)
            self._util_buf.extend(gpass.util)
        except Exception as exc:
            self.errors += 1
            self.last_error = f"gpu: {type(exc).__name__}: {exc}"
        self.last_pass_s = time.perf_counter() - t0

    def publish_inventory(self) -> None:
        """Write the GPU inventory to the store when it changed (a GPU lost, say)."""
        inv = (self.gpu.available, self.gpu.notice, tuple(self.gpu.devices()))
        if inv != self._inventory:
            self.store.set_gpu_inventory(*inv)
            self._inventory = inv

    def _refresh_ranks(self) -> None:
        """A distributed job's ranks, as their probes reported them (once a second)."""
        if self._run_id is not None:
            ranks = {int(r["rank"]): int(r["pid"])  # (tuples: no DataFrame each second)
                     for r in self.store.rank_records(self._run_id)}
            if ranks != self.host._ranks:
                self.host.follow_ranks(ranks)
                self.gpu.follow_pids({*ranks.values(), *filter(None, [self.host._pid])})

    def flush(self) -> None:
        host, self._host_buf = self._host_buf, []
        gpu, self._gpu_buf = self._gpu_buf, []
        util, self._util_buf = self._util_buf, []
        try:
            self.store.insert(host)
            self.store.insert(gpu)
            self.store.insert(util)
            self.publish_inventory()
            self._refresh_ranks()
        except Exception as exc:
            self.errors += 1
            self.last_error = f"store write failed: {exc}"

    def _tick(self) -> None:
        """One pass, and the buffers written each flush_interval (monitor/periodic.py keeps
        the schedule: a pass that fell behind is followed by one at once, never a burst)."""
        self.sample_once()
        now = self.clock()
        if now - self._last_flush >= self.flush_interval:
            self.flush()
            self._last_flush = now


# The sampler's scheduling priority where the user may raise it (root; CAP_SYS_NICE): a pass
# takes a few ms every 250 ms, and on a saturated 2-core host an ordinary priority left gaps.
SAMPLER_NICE = -5


def serve(db: str, key: str, parent_pid: int, poll_s: float = 0.2) -> None:
    """The collector process: follow what the store says, until SIGTERM or the parent exits."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(OSError):  # ahead of page rendering and training when allowed
        os.nice(SAMPLER_NICE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the dashboard's Ctrl-C is the parent's
    store = Store(db)
    col = Collector(store).start()
    current: str | None = None
    try:
        while not stop.wait(poll_s) and os.getppid() == parent_pid:
            want = store.meta(key)
            if want != current:
                current = want
                pid, run_id = json.loads(want) if want else (None, None)
                col.follow(pid, run_id)
    finally:
        col.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m monitor.sampling.collector")
    ap.add_argument("--db", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--parent-pid", type=int, required=True)
    a = ap.parse_args()
    serve(a.db, a.key, a.parent_pid)
