"""The verdicts: each a small function of the window's Features, tried in RULES order.

Order, and why: memory pressure first (it can kill the job, whatever else is slow); then a
transfer-bound step (on CUDA, the copy is the step); a warm-up that took most of the run (its
steady state is not where its time went); then healthy (the device is fed: nothing else
matters); epoch stalls (lost at each epoch start, whatever the steady state); then the
CPU: oversubscribed (more workers than cores, all busy), cpu-bound (cores saturated, or the
loaders measured waiting for a CPU: contention); io-bound (loaders measured blocked, and
reading); tail stalls (a few rare slow batches hold most of the wait: a deeper queue, not
more workers); and starving, the rest. The first rule that fires names the verdict. Every
sentence is built from the same measured split (monitor/diagnosis/features.py: on a CPU,
waiting for one, blocked), so a headline cannot say both "CPU busy" and "waiting on storage".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor.config import max_workers as config_max_workers
from monitor.config import prefetch_of
from monitor.diagnosis.bound import BoundModel, best_workers, fit_bound
from monitor.diagnosis.features import Features
from monitor.diagnosis.finding import Advice, Diagnosis
from monitor.thresholds import (
    BY_THE_LINE,
    CPU_BUSY_NOISE,
    CPU_SATURATED,
    CPU_THROTTLED_SHARE,
    EPOCH_STALL_SHARE,
    LOADERS_BLOCKED_SHARE,
    MEMORY_HEADROOM,
    MIN_GAIN,
    NOISE_Z,
    OTHER_LOAD_CORES,
    RUNQ_CONTENTION_SHARE,
    SPIKE_X,
    STARVING_SHARE,
    STORAGE_READ_KB,
    TAIL_MAX_STEP_SHARE,
    TAIL_ROUND_SHARE,
    TAIL_WAIT_SHARE,
    TRANSFER_SHARE,
    VERDICT_MIN_STEPS,
    WARMUP_DOMINANT_SHARE,
    by_the_line,
)

# The one verdict vocabulary (a closed set): every JSON, chart and banner uses these names.
HEALTHY, STARVING, CPU_BOUND, IO_BOUND = "healthy", "starving", "cpu-bound", "io-bound"
MEMORY_PRESSURE, OVERSUBSCRIBED = "memory-pressure", "oversubscribed"
EPOCH_STALL, TRANSFER_BOUND, NO_DATA = "epoch-stall", "transfer-bound", "no data"
INPUT_STRAGGLER = "input-straggler"  # a job's ranks: diagnosis/straggler.py
WARM_UP, TAIL_STALLS = "warm-up", "tail-stalls"
VERDICTS = (HEALTHY, STARVING, CPU_BOUND, IO_BOUND, MEMORY_PRESSURE, OVERSUBSCRIBED,
            EPOCH_STALL, TRANSFER_BOUND, WARM_UP, TAIL_STALLS, INPUT_STRAGGLER, NO_DATA)
CORES_BOUND = (CPU_BOUND, OVERSUBSCRIBED)  # loader changes cannot help: the cores are full


@dataclass(frozen=True, slots=True)
class Ctx:
    """What every rule reads: the features, the fitted model (or None), and derived facts."""

    f: Features
    model: BoundModel | None
    max_workers: int
    advice: list[Advice] = field(default_factory=list)
    base: float = math.nan  # what gains are of (Advice.base_throughput); diagnose sets it

    def over(self) -> str:
        """What a percentage is of, in words."""
        f = self.f
        if self.base > f.throughput * 1.005:
            return (f"{self.base:,.0f} samples/s, this window's {f.throughput:,.0f} without "
                    f"the monitor's own {f.monitor_cpu_cores or 0:.2f} cores of CPU")
        return f"this window's {f.throughput:,.0f} samples/s"

    @property
    def saturated(self) -> bool:
        """The cores busy; within the noise of the line, taken as busy (NOISE_Z)."""
        se = max(self.f.cpu_busy_se or 0.0, CPU_BUSY_NOISE)
        return self.f.cpu_busy_fraction is not None and \
            self.f.cpu_busy_fraction >= CPU_SATURATED - NOISE_Z * se

    @property
    def blocked(self) -> bool:
        """The loaders are measured mostly blocked (not on a CPU, not waiting for one)."""
        b = self.f.loaders_blocked_share
        return b is not None and b >= LOADERS_BLOCKED_SHARE

    @property
    def contended(self) -> bool:
        """The loaders are measured waiting for a CPU much of their time."""
        q = self.f.loaders_runq_share
        return q is not None and \
            q >= RUNQ_CONTENTION_SHARE - NOISE_Z * (self.f.loaders_runq_se or 0.0)

    @property
    def reads(self) -> bool:
        kb = self.f.read_per_sample_kb
        return kb is not None and kb >= STORAGE_READ_KB

    def add(self, param: str, value: Any, pred: float | None, reason: str,
            limit: str | None = None, span: tuple[float, float] | None = None) -> None:
        lo, hi = span or (None, None)
        unsure = lo is not None and lo < MIN_GAIN * self.base <= (pred or 0.0)
        self.advice.append(Advice(param, value, pred, reason, limit, lo, hi, unsure,
                                  self.base if pred is not None else None))

    def span(self, n: int) -> tuple[float, float] | None:
        """The prediction at num_workers=n over the window's scans of the others (p10,
        p90: BoundModel.span); None where fewer than two were measured."""
        return self.model.span(n) if self.model is not None else None

    def worker_advice(self, cores_note: bool = True) -> None:
        """The knee of the bound model's num_workers curve, if it gains MIN_GAIN;
        `cores_note`: say so when the cores are then the limit (a caller that says it)."""
        if self.model is None:
            return
        f, nw, cores = self.f, self.f.num_workers, self.f.usable_cores
        n = best_workers(self.model, self.max_workers)
        pred, then = self.model.predict(n)
        if n == nw or pred < MIN_GAIN * self.base:
            return
        k = self.model.scales.get(then, 1.0)
        seen = "" if k == 1.0 else f"; x{k:.2f}, as this machine's earlier outcomes measured"
        span = self.span(n)
        said = ""
        if span is not None and span[1] - span[0] > 0.05 * pred:
            d = self.f.others_demand
            said = (f"; other processes wanted {d[0]:.1f} to {d[2]:.1f} cores while this was "
                    f"measured: {span[0]:,.0f} to {span[1]:,.0f} samples/s "
                    f"({gain(span[0], self.base)} to {gain(span[1], self.base)})")
            if span[0] < MIN_GAIN * self.base:
                said += ("; it cannot promise a gain here: an autotune trial, or a run beside "
                         "a quieter neighbour, settles it")
        self.add("num_workers", n, pred, f"num_workers {nw} → {n}: predicted {pred:,.0f} "
                 f"samples/s, {gain(pred, self.base)} over {self.over()} (limit then: "
                 f"{then}{seen}){said}",
                 then, span)
        if nw == 0 and f.epoch_starts >= 1 and not f.config.get("persistent_workers"):
            # epochs shorter than the window (Lightning's defaults): without it each epoch
            # pays the new workers' start-up, which can eat their gain (the tuner's knee move
            # from none sets it too)
            self.add("persistent_workers", True, None, "with the workers above: keeps them "
                     f"alive between epochs; {f.epoch_starts} epoch(s) began in this window, "
                     "and each would pay their start-up again")
        if then == "cores" and cores_note:
            self.add("dataset", "cheaper transforms", None, f"at {n} workers the {cores} "
                     "usable cores are the limit: more workers will not help; cut per-sample "
                     "CPU work (caching, GPU-side augmentation, pre-processed data)")


def gain(new: float, now: float) -> str:
    return f"{(new / now - 1) * 100:+.0f}%" if now > 0 else ""


Rule = Callable[[Ctx], "str | None"]  # returns the headline when the rule fires


def memory_pressure(c: Ctx) -> str | None:
    f = c.f
    if f.memory_fraction is None or f.memory_fraction < MEMORY_HEADROOM:
        return None
    nw, pf = f.num_workers, prefetch_of(f.config)
    if nw > 0 and pf > 1:
        c.add("prefetch_factor", 1, None, f"prefetch_factor {pf} → 1: {nw * (pf - 1)} fewer "
              "batches held in memory at once")
    if nw > 1:
        per, fewer = f.worker_mb, max(1, nw // 2)
        pred, then = c.model.predict(fewer) if c.model else (None, None)
        c.add("num_workers", fewer, pred,
              f"num_workers {nw} → {fewer}: frees about {(nw - fewer) * per:,.0f} MB"
              if per else f"num_workers {nw} → {fewer}", then)
    if f.config.get("pin_memory"):
        c.add("pin_memory", False, None, "pinned pages cannot be swapped or reclaimed")
    if f.memory_budget_mb:
        of = f"the budget ({f.workload_mem_mb or 0:,.0f} of {f.memory_budget_mb:,.0f} MB)"
    else:
        of = f"memory ({f.mem_total_mb or 0:,.0f} MB in all)"
    return f"Memory pressure: the workload uses {f.memory_fraction:.0%} of {of}."


def transfer_bound(c: Ctx) -> str | None:
    f = c.f
    if f.copy_share is None or f.copy_share < TRANSFER_SHARE or f.config.get("pin_memory"):
        return None
    c.add("pin_memory", True, None, "page-locked batches copy by DMA and overlap compute "
          "with non_blocking=True")
    return (f"Transfer-bound: copying batches to the GPU takes {f.copy_share:.0%} of the "
            "step; pageable memory makes non_blocking copies synchronous.")


def warm_up(c: Ctx) -> str | None:
    """Most of the run went to its first steps (worker start-up, imports, cold caches,
    compilation): its steady state is not what the run spent its time on."""
    f = c.f
    if f.warmup_share is None or f.warmup_share < WARMUP_DOMINANT_SHARE:
        return None
    if f.num_workers > 0 and not f.config.get("persistent_workers") and f.epoch_starts >= 1:
        c.add("persistent_workers", True, None, "keeps workers alive between epochs, so "
              "their start-up is paid once, not at each epoch")
    steady = (f"data wait {f.data_wait_share:.0%} of step time, "
              f"{f.throughput:,.0f} samples/s")
    return (f"Warm-up: the run's first {f.warmup_steps} step(s) took {f.warmup_lost_s:.1f} s "
            f"beyond steady-state steps, {f.warmup_share:.0%} of the run (first step "
            f"{f.first_step_s:.2f} s: worker start-up, imports, cold caches); a longer run "
            f"amortises it. In steady state: {steady}.")


def tail_stalls(c: Ctx) -> str | None:
    """A few slow batches hold most of the wait: not a slow pipeline, a slow sample (a cold
    file, a large record, a GC pause). A deeper queue rides them out; more workers only if
    the steady wait is also high."""
    f = c.f
    # rare: n workers hand over batches in rounds, so one step in n waiting is the pipeline
    rounds = TAIL_ROUND_SHARE / max(f.num_workers, 1)
    rare = f.spike_steps <= f.steps * min(TAIL_MAX_STEP_SHARE, rounds)
    if f.spike_steps < 2 or not rare or f.spike_wait_share is None or \
            f.spike_wait_share < TAIL_WAIT_SHARE:
        return None
    lost = f.spike_wait_share * f.data_wait_share * f.window_s
    pred = c.base * f.window_s / max(f.window_s - lost, 1e-9)
    nw, pf = f.num_workers, prefetch_of(f.config)
    if nw > 0:
        c.add("prefetch_factor", pf * 2, pred, f"prefetch_factor {pf} → {pf * 2}: a deeper "
              f"queue rides out a slow batch; up to {gain(pred, c.base)} if the stalls "
              "are absorbed")
    else:
        c.add("num_workers", 2, pred, "num_workers 0 → 2: a slow batch loads while the "
              f"others are consumed; up to {gain(pred, c.base)} if the stalls are "
              "absorbed")
    return (f"Tail stalls: {f.spike_steps} of {f.steps} steps waited at least "
            f"{SPIKE_X:g} median steps for data, and they hold {f.spike_wait_share:.0%} of "
            f"the data wait (step time p99/median {f.tail_ratio or 0:.1f}x): a few slow "
            "batches, not a slow pipeline.")


def healthy(c: Ctx) -> str | None:
    f, nw = c.f, c.f.num_workers
    noise = f.starving_noise
    if not f.fed:  # (within the noise of the line: fed)
        return None
    if nw > 1 and c.model is not None:
        n = best_workers(c.model, nw)
        if n < nw:
            pred, then = c.model.predict(n)
            c.add("num_workers", n, pred, f"num_workers {nw} → {n} keeps the device fed with "
                  f"{nw - n} fewer processes (less memory and start-up)", then)
    if f.device_idle_share is not None:
        return (f"Healthy: the device is idle {f.device_idle_share:.0%} of the time between "
                f"steps (CUDA events; below {STARVING_SHARE:.0%}); it is fed.")
    # one decimal: a share by the line reads as itself ("10% (below 10%)" was 9.6%)
    where = (f"below {STARVING_SHARE:.0%}" if f.data_wait_share < STARVING_SHARE else
             f"within identical runs' spread of the {STARVING_SHARE:.0%} line" if f.judged_as
             else f"within the noise of the {STARVING_SHARE:.0%} line: ±{noise:.1%} between "
             "parts of the window")
    return (f"Healthy: data wait is {by_the_line(f.data_wait_share)} of step time ({where}); the "
            "device is fed.")


def epoch_stall(c: Ctx) -> str | None:
    f = c.f
    if (f.num_workers == 0 or f.config.get("persistent_workers") or f.epoch_starts < 1
            or not f.epoch_stall_share >= EPOCH_STALL_SHARE):
        return None
    pred = c.base * f.window_s / max(f.window_s - f.epoch_stall_s, 1e-9)
    c.add("persistent_workers", True, pred, "keeps workers (and what they opened) alive "
          f"between epochs: up to {f.epoch_stall_s:.1f} s back in this window, "
          f"{gain(pred, c.base)}")
    step = ""
    if f.epoch_stall_step_s > 0.5 * f.epoch_stall_s:
        step = (f"; each epoch's first step then took {f.epoch_stall_step_s / f.epoch_starts:.2f}"
                " s longer than a typical one, the starting workers on its CPUs")
    return (f"Epoch stalls: {f.epoch_stall_share:.0%} of the time is lost at "
            f"{f.epoch_starts} epoch start(s) (first batch after {f.first_batch_s or 0:.2f} s"
            f"{step}) while workers restart.")


def oversubscribed(c: Ctx) -> str | None:
    f, nw, cores = c.f, c.f.num_workers, c.f.usable_cores
    if not (nw > cores and c.saturated and not c.blocked):
        return None
    pred, then = c.model.predict(cores) if c.model else (None, None)
    if (f.same_group_demand or 0.0) < OTHER_LOAD_CORES:
        # no other process of the job's own scheduling group wants the cores: `cores`
        # workers keep them as busy as `nw` did, the main process's share included
        # (bench/predictions.py, quiet, 4 -> 2: the model's own said x0.64, bare x0.97);
        # beside neighbours in the group the share the workers lose is the model's
        pred, then = max(pred or 0.0, c.base), "cores"
    if pred is not None and pred < MIN_GAIN ** -1 * c.base:
        # the extra workers win CPU from the others in the job's own group (bench/
        # predictions.py, same session, 4 -> 2: predicted x0.61, bare x0.82): fewer would
        # lose it, so no fewer-workers advice; the cores are the fix
        return (f"Oversubscribed: {nw} workers on {cores} usable cores, CPU "
                f"{f.cpu_busy_fraction:.0%} busy, shared with other processes in the "
                f"job's own scheduling group ({f.same_group_demand or 0:.1f} cores): the "
                f"extra workers win their share of it, so {cores} would lose "
                f"{1 - pred / c.base:.0%} of the throughput (predicted); freeing the cores "
                "helps, fewer workers do not.")
    c.add("num_workers", cores, pred, f"num_workers {nw} → {cores}: as fast with less "
          "memory and contention" + (f" (predicted {pred:,.0f} samples/s)" if pred else ""),
          then)
    return (f"Oversubscribed: {nw} workers on {cores} usable cores, CPU "
            f"{f.cpu_busy_fraction:.0%} busy; the extra processes only compete.")


def cpu_bound(c: Ctx) -> str | None:
    f, cores = c.f, c.f.usable_cores
    if not (c.saturated or c.contended) or c.blocked:
        return None  # a loader that mostly waits on something else is not held by cores
    other = f.other_cpu_cores or 0.0
    if c.contended:
        text = (f"CPU contention: the loaders wait {f.loaders_runq_share:.0%} of their time "
                f"for a CPU; other processes take {other:.1f} of the {cores} usable cores.")
        before = len(c.advice)
        c.worker_advice(cores_note=False)
        more = [a for a in c.advice[before:] if a.param == "num_workers"
                and a.value > f.num_workers]
        if more:
            seen = f" (about {f.others_runnable:.1f} others runnable)" \
                if f.others_runnable is not None else ""
            text += (f" The scheduler shares the cores per runnable process{seen}, so more "
                     f"workers take a larger share: num_workers {f.num_workers} → "
                     f"{more[0].value} predicted "
                     f"{gain(more[0].predicted_throughput, c.base)}, taken from the "
                     "other jobs; freeing the cores gives more.")
        else:
            text += " More workers would only wait too."
    else:
        text = (f"CPU-bound: the {cores} usable cores are {f.cpu_busy_fraction:.0%} busy and "
                f"the device still waits {f.data_wait_share:.0%} of the time; more workers "
                "will not help.")
    if other >= OTHER_LOAD_CORES:
        if not c.contended:
            text += f" {other:.1f} of those cores go to other processes, not the loader."
        c.add("host", "free cores", None, f"other processes take {other:.1f} of the {cores} "
              "usable cores (another job, a browser, a notebook): stop or move them, or give "
              "this job more cores")
    c.add("dataset", "cheaper transforms", None, "the cores are saturated by per-sample work: "
          "cache decoded samples, move augmentation to the GPU (e.g. DALI, "
          "torchvision.transforms.v2 on tensors), or store pre-processed data")
    if f.cpu_throttled and f.cpu_throttled > CPU_THROTTLED_SHARE:
        c.add("dataset", "raise the CPU quota", None, f"the cgroup was throttled in "
              f"{f.cpu_throttled:.0%} of periods (quota {f.cpu_quota} cores)")
    return text


def io_bound(c: Ctx) -> str | None:
    f = c.f
    if not (c.blocked and c.reads):
        return None
    c.worker_advice()
    c.add("dataset", "faster storage", None, "local NVMe, a page-cache-friendly format "
          "(WebDataset shards, LMDB), or caching the dataset in memory")
    return (f"IO-bound: the loaders are blocked {f.loaders_blocked_share:.0%} of their time "
            f"(not on a CPU, not waiting for one) and read {f.read_per_sample_kb:,.1f} KB per "
            "sample from the disk: storage latency. More workers overlap it, beyond the core "
            "count.")


def starving(c: Ctx) -> str:
    f, nw = c.f, c.f.num_workers
    c.worker_advice()
    loader = (f.workers_cpu_cores if nw > 0 else f.main_cpu_cores) or 0.0
    where = "loading runs in the main process" if nw == 0 else "the workers"
    seen = (f"is idle {f.device_idle_share:.0%} of the time between steps (CUDA events; "
            f"host data wait {f.data_wait_share:.0%})" if f.device_idle_share is not None
            else f"waits for data {by_the_line(f.data_wait_share, near=BY_THE_LINE)} of step "
            "time")
    text = (f"Starving: the device {seen}; "
            f"{where} cannot keep up ({loader:.1f} of {f.usable_cores} cores busy loading).")
    if c.blocked:
        text += (f" The loaders are blocked {f.loaders_blocked_share:.0%} of their time "
                 "without reading from storage (a sleep, a lock, a remote call): more "
                 "workers overlap it.")
    if f.missing_evidence:
        text += f" Not measured here: {', '.join(f.missing_evidence)}."
    return text


RULES: tuple[tuple[str, Rule], ...] = (
    (MEMORY_PRESSURE, memory_pressure), (TRANSFER_BOUND, transfer_bound), (WARM_UP, warm_up),
    # epoch stalls before healthy: where the step runs on the host's CPU a restart can cost
    # the epoch's first step, not its wait (analysis.epoch_stalls), and the device is "fed"
    (EPOCH_STALL, epoch_stall), (HEALTHY, healthy), (OVERSUBSCRIBED, oversubscribed),
    (CPU_BOUND, cpu_bound), (IO_BOUND, io_bound), (TAIL_STALLS, tail_stalls),
    (STARVING, starving),
)


PREDICTED_AT = "; predicted at num_workers="  # the bound's text: its first advice's figure


def without_prediction(bound: dict[str, Any]) -> dict[str, Any]:
    """The bound with its text's figure for the first advice (bound_text) taken off: where
    that advice was dropped (causes.with_findings)."""
    return {**bound, "text": str(bound.get("text") or "").split(PREDICTED_AT)[0]}


def bound_text(c: Ctx) -> dict[str, Any]:
    """The bound for the JSON and the page: throughput now, the limit, the prediction."""
    f = c.f
    out: dict[str, Any] = {"throughput": f.throughput, "limit": None, "text": "",
                           "predicted_now": None}
    if c.model is None:
        return out
    pred_now, limit = c.model.predict(f.num_workers)
    loader = (f.workers_cpu_cores if f.num_workers > 0 else f.main_cpu_cores) or 0.0
    d, o = c.model.device_time(c.model.batch_size), c.model.overhead_at(f.num_workers)
    limit_text = {
        "device": f"the step and the loop's own time a batch ({d * 1e3:.1f} + {o * 1e3:.1f} "
                  "ms; the loader keeps up)",
        "workers": f"workers ({loader:.1f} of {f.usable_cores} usable cores busy producing)",
        "cores": f"cores (the loaders get {c.model.cores_for(f.num_workers):.1f} of "
                 f"{f.usable_cores} usable cores; the main process and other processes "
                 "the rest)",
        "main process": "loading in the main process (num_workers=0)",
    }[limit]
    text = f"now {f.throughput:,.0f} samples/s; limit: {limit_text}"
    first = c.advice[0] if c.advice else None
    if first is not None and first.param == "num_workers" and first.predicted_throughput:
        text += f"{PREDICTED_AT}{first.value}: {first.predicted_throughput:,.0f}"
    return {**out, "limit": limit, "text": text, "predicted_now": pred_now}


def diagnose(f: Features, max_workers: int | None = None,
             scales: dict[str, float] | None = None) -> Diagnosis:
    """The verdict, the bound, and ordered advice for one window; `scales`: this machine's
    measured / predicted for a change of setting, by the limit predicted (bound.py)."""
    if f.steps < VERDICT_MIN_STEPS or math.isnan(f.data_wait_share):
        return Diagnosis(NO_DATA, f"Judging after {VERDICT_MIN_STEPS} steps: "
                         f"{f.steps} so far in this window.",
                         {"throughput": None, "limit": None, "text": "",
                          "predicted_now": None})
    model = fit_bound(f, scales)
    c = Ctx(f, model, max_workers if max_workers is not None else
            config_max_workers(f.usable_cores),
            base=f.throughput * (model.bare_factor() if model is not None else 1.0))
    for verdict, rule in RULES:
        headline = rule(c)
        if headline is not None:
            return Diagnosis(verdict, headline, bound_text(c), tuple(c.advice))
    raise AssertionError("the starving rule always fires")
