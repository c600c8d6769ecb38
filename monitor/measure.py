"""A managed run without the UI: start, wait, stop, summarise (the `measure` command)."""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from monitor.analysis import (
    Summary,
    series_stats,
    span,
    steady_state,
    summarize,
    throughput,
)
from monitor.collector import Collector
from monitor.config import LoaderConfig, max_workers
from monitor.diagnosis import Diagnosis, diagnose, features
from monitor.gpu import workload_gpu
from monitor.host import cpu_budget
from monitor.session import SessionManager
from monitor.store import Store


def warmup_seconds(seconds: float) -> float:
    """Discarded start of a measurement: worker start-up and the first batches. A fifth of
    the run, at most 2 s."""
    return min(2.0, 0.2 * seconds)


@dataclass(frozen=True, slots=True)
class Measurement:
    run_id: int
    status: str
    error: str | None
    accelerator: str | None
    config: LoaderConfig
    summary: Summary
    gpu: int | None = None  # NVML index the workload ran on
    gpu_util_mean: float | None = None  # NVML utilization over the same window, 0..100
    gpu_util_cv: float | None = None
    diagnosis: Diagnosis | None = None
    window_throughputs: tuple[float, ...] = ()  # steady state cut into equal windows
    peak_rss_mb: float | None = None  # the workload's process tree (main + workers)
    cancelled: bool = False

    @property
    def throughput_spread(self) -> float | None:
        """(max - min) / median of the windows' throughputs."""
        w = sorted(self.window_throughputs)
        if len(w) < 2:
            return None
        med = statistics.median(w)
        return (w[-1] - w[0]) / med if med > 0 else None

    @property
    def median_throughput(self) -> float:
        if self.window_throughputs:
            return statistics.median(self.window_throughputs)
        return self.summary.throughput

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"run_id": self.run_id, "status": self.status}
        d.update(self.summary.to_dict())
        d.update(throughput_spread=self.throughput_spread, peak_rss_mb=self.peak_rss_mb)
        if self.diagnosis is not None:
            d.update(self.diagnosis.summary_fields())
        d.update({"gpu": self.gpu, "gpu_util_mean": self.gpu_util_mean,
                  "gpu_util_cv": self.gpu_util_cv})
        d.update({"error": self.error, "accelerator": self.accelerator,
                  "config": self.config.to_dict()})
        return d


def measure(
    store: Store, config: LoaderConfig, seconds: float, collector: Collector | None = None,
    name: str | None = None, memory_budget_mb: float | None = None,
    manager: SessionManager | None = None, windows: int = 1,
    cancel: threading.Event | None = None,
) -> Measurement:
    """Run `config` for `seconds` (plus the time to the first batch), then stop and
    summarise the steady state, cut into `windows` equal windows. The run stays in the store.

    With `manager` the run is started and stopped through it (a sweep, the page) and it stays
    open; `cancel` ends the run early (the result says so)."""
    own_collector = collector is None
    if collector is None:
        collector = Collector(store).start()
    own_manager = manager is None
    if manager is None:
        manager = SessionManager(store, config, on_start=collector.watch)
    cancelled = False
    try:
        run_id = manager.start(config, name=name)
        # The clock starts at the first batch: spawning and importing torch is not the loader.
        deadline = time.monotonic() + 120.0
        while not manager.wait_for_steps(1, timeout=0.5) and time.monotonic() < deadline:
            if cancel is not None and cancel.is_set() or not manager.is_alive():
                break
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and manager.is_alive():
            if cancel is not None and cancel.wait(0.1):
                break
            time.sleep(0.1 if cancel is None else 0.0)
        cancelled = cancel is not None and cancel.is_set()
    finally:
        if own_manager:
            manager.close()
        else:
            manager.stop()
        collector.watch(None, None)
        if own_collector:
            collector.stop()
    run = store.run(run_id) or {}
    steps = steady_state(store.steps(run_id), warmup_seconds(seconds))
    window_thr: tuple[float, ...] = ()
    peak = None
    if not steps.empty:
        start, end = span(steps)
        edges = [start + (end - start) * i / max(1, windows) for i in range(windows + 1)]
        window_thr = tuple(
            throughput(steps[(steps["ts"] >= a) & (steps["ts"] < b)]) for a, b in
            zip(edges[:-1], edges[1:], strict=True))
        window_thr = tuple(t for t in window_thr if t == t)  # drop empty windows (NaN)
        host = store.host_samples(start, end)
        host = host[host["run_id"] == run_id] if "run_id" in host.columns else host
        if not host.empty and host["proc_rss_mb"].notna().any():
            # workers share the parent's pages (fork): their USS is what each one adds
            workers = host["workers_uss_mb"].ffill().fillna(host["workers_rss_mb"])
            peak = float((host["proc_rss_mb"].fillna(0) + workers.fillna(0)).max())
    gpu, mean, cv = None, None, None
    if collector.gpu.available and not steps.empty:
        gpu = workload_gpu(collector.gpu.devices(), run.get("device"))
        start, end = span(steps)
        util = store.gpu_util(start, end)
        if gpu is not None:
            util = util[util["gpu"] == gpu]
        mean, cv = series_stats(util["util_pct"])
    dg = None
    if not steps.empty:
        start, end = span(steps)
        simulated = not (run.get("accelerator") or "").startswith("CUDA")
        f = features(steps, store.host_samples(start, end), config, cpu_budget(), simulated,
                     memory_budget_mb)
        dg = diagnose(f, max_workers())
    return Measurement(
        run_id=run_id, status=run.get("status", "unknown"), error=run.get("error"),
        accelerator=run.get("accelerator"), config=config, summary=summarize(steps),
        gpu=gpu, gpu_util_mean=mean, gpu_util_cv=cv, diagnosis=dg,
        window_throughputs=window_thr, peak_rss_mb=peak, cancelled=cancelled,
    )

