"""Why the device starves, what limits throughput, and what to change: pure functions over
the store's frames (steps and host samples of one window, one loader configuration).

1. `features` measures the window: data-wait share, device busy, idle gaps, the sawtooth's
   period, epoch-start stalls, host CPU (total, main process, workers), memory, the CPU budget.
2. `fit_bound` turns those into a bound model: per-sample CPU time and storage latency of
   loading, device time per batch, cores left for workers. `BoundModel.predict` gives the
   throughput of any (num_workers, batch_size) as the minimum of what the device can take,
   what the workers can produce, and what the usable cores can compute.
3. `diagnose` names the verdict with its evidence and orders concrete advice, each with the
   predicted throughput.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from monitor import analysis
from monitor.config import LoaderConfig
from monitor.host import CpuBudget

BUDGET_ENV = "STARVATION_MONITOR_MEMORY_BUDGET_MB"

# Thresholds, each with where it comes from.
STARVING_SHARE = analysis.STARVING_SHARE  # see analysis.py
# Host CPU busy over the usable cores above which more loader processes cannot run in
# parallel: 85% leaves room for the sampling jitter of 0.25 s psutil readings.
CPU_SATURATED = 0.85
# Loading CPU time / loading wall time per sample below which a loader mostly waits on
# storage (sleeping in read()), so workers beyond the core count still help.
IO_CPU_RATIO = 0.5
# Workload memory (main + workers RSS + /dev/shm) over the budget above which the kernel
# starts reclaiming page cache and the OOM killer is near: 85%, as Kubernetes' default
# memory eviction margin and earlyoom's defaults sit around 10-15% free.
MEMORY_PRESSURE = 0.85
# Time lost at epoch starts over the window above which restarting workers per epoch matters.
EPOCH_STALL_SHARE = 0.10
# Host-to-device copy time over compute above which the copy, not the model, is the step.
TRANSFER_SHARE = 0.30
# CPU taken by processes outside the workload above which the verdict names them: half a
# core is more than the sampling noise of the host total minus the workload's own.
OTHER_LOAD_CORES = 0.5
# Advise a change only when it is predicted to gain at least this much (noise on a shared
# host is about ±5%).
MIN_GAIN = 1.10
# The advised num_workers is the smallest reaching this share of the best prediction (more
# processes cost memory and start-up for the last few percent).
KNEE = 0.97
# Per-step cost in the main process with workers on (collate, queue, unpickle), when the
# window cannot show it: about a millisecond in torch's own DataLoader benchmarks.
DEFAULT_OVERHEAD_S = 0.001

SLIDER_PARAMS = ("num_workers", "batch_size", "prefetch_factor", "pin_memory",
                 "persistent_workers")  # advice the page can apply by moving a slider
VERDICTS = ("healthy", "starving", "cpu-bound", "io-bound", "memory-pressure",
            "oversubscribed", "epoch-stall", "transfer-bound", "no data")


@dataclass(frozen=True, slots=True)
class Features:
    """What one window measured. Times in seconds, CPU in cores (1.0 = one core busy)."""

    config: dict[str, Any]
    simulated: bool
    steps: int
    seconds: float
    throughput: float
    data_wait_share: float
    busy_mean: float
    busy_cv: float
    idle_gaps: int
    idle_gap_median_s: float | None
    period_s: float | None
    duty_cycle: float
    epoch_starts: int
    epoch_stall_s: float
    epoch_stall_share: float
    first_batch_s: float | None
    wait_per_step_s: float
    compute_per_step_s: float
    copy_share: float | None
    host_cpu_cores: float | None  # the whole host, all processes
    main_cpu_cores: float | None
    workers_cpu_cores: float | None
    workers_live: float | None
    other_cpu_cores: float | None  # host CPU used outside the workload (other jobs, this UI)
    cpu_per_sample_s: float | None  # loading CPU time per sample
    wall_per_sample_s: float | None  # loading wall time per sample, one loader process
    usable_cores: int
    cpu_quota: float | None
    cpu_throttled: float | None
    mem_total_mb: float | None
    mem_available_mb: float | None
    memory_budget_mb: float | None
    workload_mem_mb: float | None  # main RSS + workers' USS (else RSS) + /dev/shm growth
    worker_rss_mb: float | None  # per worker
    worker_uss_mb: float | None  # per worker

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}


def _mean(df: pd.DataFrame, col: str) -> float | None:
    if df.empty or col not in df.columns:
        return None
    v = pd.to_numeric(df[col], errors="coerce").dropna()
    return float(v.mean()) if len(v) else None


def memory_budget_mb(explicit: float | None = None) -> float | None:
    if explicit is not None:
        return explicit
    env = os.environ.get(BUDGET_ENV)
    return float(env) if env else None


def features(
    steps: pd.DataFrame, host: pd.DataFrame, config: LoaderConfig, budget: CpuBudget,
    simulated: bool = True, memory_budget: float | None = None,
) -> Features:
    """Measure a window of one configuration (steps and host samples over the same time)."""
    s = analysis.summarize(steps)
    nan = float("nan")
    if steps.empty:
        start = end = 0.0
    else:
        start, end = analysis.span(steps)
    busy = analysis.busy_series(steps, start=start, end=end) if not steps.empty else \
        pd.DataFrame({"t": [], "busy": []})
    period, duty = analysis.sawtooth(busy)
    gaps, gap_med = analysis.idle_gaps(steps)
    n_epochs, stall, first = analysis.epoch_stalls(steps)
    span_s = max(end - start, 1e-9)
    samples = float(steps["samples"].sum()) if not steps.empty else 0.0
    h = host[(host["ts"] >= start) & (host["ts"] <= end)] if not host.empty else host
    pct = {c: _mean(h, c) for c in ("cpu_total_pct", "proc_cpu_pct", "workers_cpu_pct",
                                    "workers")}
    ncores = None
    if not h.empty and "cpu_per_core" in h.columns and h["cpu_per_core"].notna().any():
        ncores = len(json.loads(h["cpu_per_core"].dropna().iloc[0]))
    host_cores = pct["cpu_total_pct"] / 100 * ncores if pct["cpu_total_pct"] is not None \
        and ncores else None
    main_cores = pct["proc_cpu_pct"] / 100 if pct["proc_cpu_pct"] is not None else None
    workers_cores = pct["workers_cpu_pct"] / 100 if pct["workers_cpu_pct"] is not None else None
    nw = config.num_workers
    cpu_per_sample = wall_per_sample = None
    if samples > 0:
        if nw == 0:
            if main_cores is not None:
                # the simulated accelerator sleeps: the main process's CPU is loading
                cpu_per_sample = main_cores * span_s / samples
            wall_per_sample = float(steps["wait_s"].sum()) / samples
        else:
            if workers_cores is not None:
                cpu_per_sample = workers_cores * span_s / samples
            if s.data_wait_share >= STARVING_SHARE:  # workers saturated: each makes 1/nw
                wall_per_sample = nw * span_s / samples
    if cpu_per_sample is not None and wall_per_sample is not None:
        cpu_per_sample = min(cpu_per_sample, wall_per_sample)
    copy = None
    if "copy_s" in steps.columns and steps["copy_s"].notna().any():
        copy = float(steps["copy_s"].sum() / max(steps["compute_s"].sum(), 1e-9))
    mem_budget = memory_budget_mb(memory_budget)
    rss = _mean(h, "proc_rss_mb")
    wrss = _mean(h, "workers_rss_mb")
    wuss = _mean(h, "workers_uss_mb")
    shm = None
    if not h.empty and "shm_used_mb" in h.columns and h["shm_used_mb"].notna().any():
        shm = float(h["shm_used_mb"].max() - h["shm_used_mb"].min())
    workload_mem = None
    if rss is not None:
        workload_mem = rss + (wuss if wuss is not None else (wrss or 0.0)) + (shm or 0.0)
    live = pct["workers"]

    def per(v: float | None) -> float | None:
        return v / live if v is not None and live else None

    return Features(
        config=config.to_dict(), simulated=simulated, steps=s.steps, seconds=s.seconds,
        throughput=s.throughput, data_wait_share=s.data_wait_share,
        busy_mean=s.device_busy_mean, busy_cv=s.device_busy_cv, idle_gaps=gaps,
        idle_gap_median_s=gap_med, period_s=period, duty_cycle=duty, epoch_starts=n_epochs,
        epoch_stall_s=stall, epoch_stall_share=stall / span_s if not steps.empty else nan,
        first_batch_s=first,
        wait_per_step_s=float(steps["wait_s"].mean()) if not steps.empty else nan,
        compute_per_step_s=float(steps["compute_s"].median()) if not steps.empty else nan,
        copy_share=copy, host_cpu_cores=host_cores, main_cpu_cores=main_cores,
        workers_cpu_cores=workers_cores, workers_live=live,
        other_cpu_cores=(max(0.0, host_cores - (main_cores or 0.0) - (workers_cores or 0.0))
                         if host_cores is not None else None),
        cpu_per_sample_s=cpu_per_sample,
        wall_per_sample_s=wall_per_sample, usable_cores=budget.usable, cpu_quota=budget.quota,
        cpu_throttled=budget.throttled, mem_total_mb=_mean(h, "mem_total_mb"),
        mem_available_mb=(float(h["mem_available_mb"].min())
                          if not h.empty and h["mem_available_mb"].notna().any() else None),
        memory_budget_mb=mem_budget, workload_mem_mb=workload_mem, worker_rss_mb=per(wrss),
        worker_uss_mb=per(wuss),
    )


@dataclass(frozen=True, slots=True)
class BoundModel:
    """Throughput bounds from measured costs (seconds; cores).

    cpu_s: loading CPU time per sample; latency_s: loading time per sample spent off-CPU
    (storage); device_s: device time per batch at `batch_size`, constant in the batch size for
    the simulated accelerator and proportional to it on a GPU; overhead_s: main-process time
    per step with workers on; cores: CPU left for workers.
    """

    cpu_s: float
    latency_s: float
    device_s: float
    batch_size: int
    device_scales: bool
    overhead_s: float
    cores: float

    def device_time(self, batch_size: int) -> float:
        return self.device_s * (batch_size / self.batch_size if self.device_scales else 1.0)

    def predict(self, num_workers: int, batch_size: int | None = None) -> tuple[float, str]:
        """(samples/s, limit) for a setting: limit is 'device', 'workers', 'cores' or
        'main process' (num_workers=0: loading and compute take turns)."""
        b = batch_size or self.batch_size
        d = self.device_time(b)
        per_sample = self.cpu_s + self.latency_s
        if num_workers == 0:
            load = b * per_sample
            return b / (load + d), ("main process" if load > d else "device")
        rates = {
            "device": b / (d + self.overhead_s),
            "workers": num_workers / per_sample if per_sample > 0 else math.inf,
            "cores": self.cores / self.cpu_s if self.cpu_s > 0 else math.inf,
        }
        limit = min(rates, key=rates.get)
        if limit == "workers" and rates["cores"] <= 1.05 * rates["workers"]:
            limit = "cores"  # a tie: more workers would not get more CPU
        return rates[limit], limit


def fit_bound(f: Features) -> BoundModel | None:
    """The bound model for a window, or None when it cannot be measured (no steps, or
    workers fed the device so well that the loading cost is hidden and unknown)."""
    cfg = f.config
    if f.steps < 3 or f.cpu_per_sample_s is None:
        return None
    cpu = max(f.cpu_per_sample_s, 1e-7)
    main = f.main_cpu_cores if cfg["num_workers"] > 0 and f.main_cpu_cores is not None else 0.05
    cores = max(0.5, f.usable_cores - main - (f.other_cpu_cores or 0.0))
    latency = loading_latency(f, cores) or 0.0
    overhead = DEFAULT_OVERHEAD_S
    if cfg["num_workers"] > 0 and f.data_wait_share < STARVING_SHARE:
        overhead = max(overhead, f.wait_per_step_s)
    return BoundModel(
        cpu_s=cpu, latency_s=latency, device_s=max(f.compute_per_step_s, 1e-6),
        batch_size=cfg["batch_size"], device_scales=not f.simulated, overhead_s=overhead,
        cores=cores,
    )


def loading_latency(f: Features, cores: float) -> float | None:
    """Off-CPU seconds per sample of loading (storage latency), or None when unknown.

    A loader's wall time per sample is its CPU time, stretched when more loaders than cores
    share the CPU (each then gets cores/N of one), plus the time it waits off-CPU."""
    if f.cpu_per_sample_s is None or f.wall_per_sample_s is None:
        return None
    nw = max(1, f.config["num_workers"])
    stretched = f.cpu_per_sample_s * max(1.0, nw / cores)
    return max(0.0, f.wall_per_sample_s - stretched)


@dataclass(frozen=True, slots=True)
class Advice:
    param: str  # a LoaderConfig field, or "dataset" for changes outside the loader
    value: Any
    predicted_throughput: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    verdict: str
    headline: str
    evidence: dict[str, Any]
    bound: dict[str, Any]
    advice: list[Advice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "headline": self.headline, "evidence": self.evidence,
                "bound": self.bound, "advice": [a.to_dict() for a in self.advice]}

    def summary_fields(self) -> dict[str, Any]:
        """The keys `measure --json` and `run --json` carry for the diagnosis."""
        return {"verdict": self.verdict, "verdict_text": self.headline,
                "bound": {k: self.bound.get(k) for k in ("throughput", "limit", "text",
                                                         "predicted_now")},
                "advice": [a.to_dict() for a in self.advice], "evidence": self.evidence}


def _gain(new: float, now: float) -> str:
    return f"{(new / now - 1) * 100:+.0f}%" if now > 0 else ""


def best_workers(model: BoundModel, max_workers: int, batch_size: int | None = None) -> int:
    """The smallest num_workers within KNEE of the best predicted throughput."""
    preds = {n: model.predict(n, batch_size)[0] for n in range(0, max_workers + 1)}
    best = max(preds.values())
    return min(n for n, p in preds.items() if p >= KNEE * best)


def diagnose(f: Features, max_workers: int | None = None) -> Diagnosis:
    """The verdict, the bound, and ordered advice for one window."""
    cfg = f.config
    nw = cfg["num_workers"]
    cores = f.usable_cores
    max_workers = max_workers if max_workers is not None else 2 * cores
    ev: dict[str, Any] = {k: v for k, v in f.to_dict().items() if k != "config"}
    if f.steps < 3 or math.isnan(f.data_wait_share):
        return Diagnosis("no data", "Not enough steps in this window to judge.", ev,
                         {"throughput": None, "limit": None, "text": ""})
    model = fit_bound(f)
    thr = f.throughput
    bound: dict[str, Any] = {"throughput": thr, "limit": None, "text": ""}
    if model is not None:
        pred_now, limit = model.predict(nw)
        bound.update(limit=limit, predicted_now=pred_now)
    share = f.data_wait_share
    cpu_busy = (f.host_cpu_cores / cores) if f.host_cpu_cores is not None else None
    loader_cores = (f.workers_cpu_cores if nw > 0 else f.main_cpu_cores) or 0.0
    saturated = cpu_busy is not None and cpu_busy >= CPU_SATURATED
    latency = loading_latency(f, float(cores))
    io_ratio = (f.cpu_per_sample_s / (f.cpu_per_sample_s + latency)
                if f.cpu_per_sample_s and latency is not None else None)
    mem_limit = f.memory_budget_mb or f.mem_total_mb
    mem_used = f.workload_mem_mb if f.memory_budget_mb else (
        f.mem_total_mb - f.mem_available_mb if f.mem_total_mb and f.mem_available_mb is not None
        else None)
    mem_frac = mem_used / mem_limit if mem_used is not None and mem_limit else None
    ev.update(cpu_busy_fraction=cpu_busy, loading_cpu_per_wall=io_ratio,
              memory_fraction=mem_frac)
    advice: list[Advice] = []

    def add(param: str, value: Any, pred: float | None, reason: str) -> None:
        advice.append(Advice(param, value, pred, reason))

    def worker_advice(limit_to_cores: bool) -> None:
        if model is None:
            return
        top = min(max_workers, cores) if limit_to_cores else max_workers
        n = best_workers(model, top)
        pred, then = model.predict(n)
        if n != nw and pred >= MIN_GAIN * thr:
            add("num_workers", n, pred,
                f"num_workers {nw} → {n}: predicted {pred:,.0f} samples/s, {_gain(pred, thr)}"
                f" (limit then: {then})")
            if then == "cores":
                add("dataset", "cheaper transforms", None, f"at {n} workers the {cores} "
                    "usable cores are the limit: more workers will not help; cut per-sample "
                    "CPU work (caching, GPU-side augmentation, pre-processed data)")

    if mem_frac is not None and mem_frac >= MEMORY_PRESSURE:
        verdict = "memory-pressure"
        headline = (f"Memory pressure: the workload uses {mem_frac:.0%} of "
                    f"{'the budget' if f.memory_budget_mb else 'memory'} "
                    f"({mem_used:,.0f} of {mem_limit:,.0f} MB).")
        pf = cfg.get("prefetch_factor") or 2
        if nw > 0 and pf > 1:
            add("prefetch_factor", 1, None, f"prefetch_factor {pf} → 1: {nw * (pf - 1)} fewer "
                "batches held in memory at once")
        if nw > 1:
            per = f.worker_uss_mb or f.worker_rss_mb
            fewer = max(1, nw // 2)
            add("num_workers", fewer, model.predict(fewer)[0] if model else None,
                f"num_workers {nw} → {fewer}: frees about "
                f"{(nw - fewer) * per:,.0f} MB" if per else f"num_workers {nw} → {fewer}")
        if cfg.get("pin_memory"):
            add("pin_memory", False, None, "pinned pages cannot be swapped or reclaimed")
    elif (f.copy_share is not None and f.copy_share >= TRANSFER_SHARE
          and not cfg.get("pin_memory")):
        verdict = "transfer-bound"
        headline = (f"Transfer-bound: copying batches to the GPU takes {f.copy_share:.0%} of "
                    "the step; pageable memory makes non_blocking copies synchronous.")
        add("pin_memory", True, None, "page-locked batches copy by DMA and overlap compute "
            "with non_blocking=True")
    elif share < STARVING_SHARE:
        verdict = "healthy"
        headline = (f"Healthy: data wait is {share:.0%} of step time (below "
                    f"{STARVING_SHARE:.0%}); the device is fed.")
        if nw > 1 and model is not None:
            n = best_workers(model, nw)
            if n < nw:
                add("num_workers", n, model.predict(n)[0],
                    f"num_workers {nw} → {n} keeps the device fed with {nw - n} fewer "
                    "processes (less memory and start-up)")
    elif (nw > 0 and not cfg.get("persistent_workers") and f.epoch_starts >= 1
          and f.epoch_stall_share >= EPOCH_STALL_SHARE):
        verdict = "epoch-stall"
        saved = f.epoch_stall_s
        pred = thr * f.seconds / max(f.seconds - saved, 1e-9)
        headline = (f"Epoch stalls: {f.epoch_stall_share:.0%} of the time is lost at "
                    f"{f.epoch_starts} epoch start(s) (first batch after "
                    f"{f.first_batch_s or 0:.2f} s) while workers restart.")
        add("persistent_workers", True, pred, "keeps workers (and what they opened) alive "
            f"between epochs: up to {saved:.1f} s back in this window, {_gain(pred, thr)}")
    elif nw > cores and saturated and (io_ratio is None or io_ratio >= IO_CPU_RATIO):
        verdict = "oversubscribed"
        headline = (f"Oversubscribed: {nw} workers on {cores} usable cores, CPU "
                    f"{cpu_busy:.0%} busy; the extra processes only compete.")
        pred = model.predict(cores)[0] if model else None
        add("num_workers", cores, pred, f"num_workers {nw} → {cores}: as fast with less "
            "memory and contention" + (f" (predicted {pred:,.0f} samples/s)" if pred else ""))
    elif saturated:
        verdict = "cpu-bound"
        other = f.other_cpu_cores or 0.0
        headline = (f"CPU-bound: the {cores} usable cores are {cpu_busy:.0%} busy and the "
                    f"device still waits {share:.0%} of the time; more workers will not help.")
        if other >= OTHER_LOAD_CORES:
            headline += f" {other:.1f} of those cores go to other processes, not the loader."
            add("host", "free cores", None, f"other processes take {other:.1f} of the {cores} "
                "usable cores (another job, a browser, a notebook): stop or move them, or "
                "give this job more cores")
        add("dataset", "cheaper transforms", None, "the cores are saturated by per-sample "
            "work: cache decoded samples, move augmentation to the GPU (e.g. DALI, "
            "torchvision.transforms.v2 on tensors), or store pre-processed data")
        if f.cpu_throttled and f.cpu_throttled > 0.1:
            add("dataset", "raise the CPU quota", None, f"the cgroup was throttled in "
                f"{f.cpu_throttled:.0%} of periods (quota {f.cpu_quota} cores)")
    elif io_ratio is not None and io_ratio < IO_CPU_RATIO:
        verdict = "io-bound"
        headline = (f"IO-bound: loading spends {1 - io_ratio:.0%} of its time off-CPU "
                    f"(storage) with CPU {cpu_busy:.0%} busy; workers beyond the core count "
                    "help." if cpu_busy is not None else "IO-bound: loading waits on storage.")
        worker_advice(limit_to_cores=False)
        add("dataset", "faster storage", None, "local NVMe, a page-cache-friendly format "
            "(WebDataset shards, LMDB), or caching the dataset in memory")
    else:
        verdict = "starving"
        headline = (f"Starving: the device waits for data {share:.0%} of step time; "
                    f"{'loading runs in the main process' if nw == 0 else 'the workers'} "
                    f"cannot keep up ({loader_cores:.1f} of {cores} cores busy loading).")
        worker_advice(limit_to_cores=False)
    if model is not None:
        pred_now, limit = model.predict(nw)
        limit_text = {
            "device": "the device (the loader keeps up)",
            "workers": f"workers ({loader_cores:.1f} of {cores} usable cores busy producing)",
            "cores": f"cores ({cores} usable cores saturated)",
            "main process": "loading in the main process (num_workers=0)",
        }[limit]
        bound["text"] = f"now {thr:,.0f} samples/s; limit: {limit_text}"
        if advice and advice[0].predicted_throughput and advice[0].param == "num_workers":
            bound["text"] += (f"; predicted at num_workers={advice[0].value}: "
                              f"{advice[0].predicted_throughput:,.0f}")
    return Diagnosis(verdict, headline, ev, bound, advice)
