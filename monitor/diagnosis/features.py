"""What one window measured: frames of steps and host samples -> Features.

Each field's metadata (label, display format) also drives the page's evidence table, so a
new measure shows up there by being declared here. Times in seconds, CPU in cores (1.0 = one
core busy), memory in MB.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pandas as pd

from monitor.diagnosis import loading
from monitor.frames import analysis
from monitor.records import CpuBudget
from monitor.thresholds import CONTENTION_MIN_WAIT, NOISE_Z, STARVING_SHARE, memory_budget_mb

SIMULATED = "simulated"  # accelerator kinds: "simulated", "cuda", "cpu" (a real CPU step)


def ev(label: str = "", fmt: str = "", default: Any = None) -> Any:
    """A Features field; with a label it is a row of the page's evidence table. `fmt` is a
    format spec, or "ms" for seconds shown as milliseconds."""
    return field(default=default, metadata={"label": label, "fmt": fmt})


@dataclass(frozen=True, slots=True)
class Features:
    config: dict[str, Any] = ev()
    accelerator: str = ev(default=SIMULATED)
    steps: int = ev("steps", "{}", 0)
    window_s: float = ev("window (s)", "{:.1f}", 0.0)
    between_epochs_s: float = ev("of it, pauses between epochs: validation, checkpoints (s)",
                                 "{:.1f}", 0.0)
    throughput: float = ev("throughput (samples/s)", "{:,.0f}", math.nan)
    data_wait_share: float = ev("data-wait share", "{:.1%}", math.nan)
    device_busy_mean: float = ev("device busy, mean", "{:.1%}", math.nan)
    device_busy_cv: float = ev("device busy, CV", "{:.2f}", math.nan)
    device_busy_source: str = ev("device busy from", "{}", "host timing")
    device_idle_share: float | None = ev("device idle between steps (CUDA events)", "{:.1%}")
    device_idle_per_step_s: float | None = ev("device idle per step (s, CUDA events)",
                                              "{:.3f}")
    idle_gaps: int = ev("idle gaps ≥ 5 ms", "{}", 0)
    idle_gap_median_s: float | None = ev("idle gap, median (s)", "{:.3f}")
    period_s: float | None = ev("sawtooth period (s)", "{:.2f}")
    duty_cycle: float = ev("duty cycle", "{:.1%}", math.nan)
    wait_per_step_s: float = ev("data wait per step (s)", "{:.3f}", math.nan)
    compute_per_step_s: float = ev("compute per step (s)", "{:.3f}", math.nan)
    epoch_starts: int = ev("epoch starts", "{}", 0)
    epoch_stall_s: float = ev(default=0.0)
    epoch_stall_share: float = ev("time lost at epoch starts", "{:.1%}", math.nan)
    epoch_stall_step_s: float = ev(default=0.0)  # of it, in the epochs' first steps
    first_batch_s: float | None = ev("time to first batch (s)", "{:.2f}")
    step_p50_s: float | None = ev("step time, median (s)", "{:.3f}")
    step_p99_s: float | None = ev("step time, p99 (s)", "{:.3f}")
    tail_ratio: float | None = ev("step time p99 / median", "{:.1f}x")
    spike_steps: int = ev("tail stalls (wait ≥ 5 median steps)", "{}", 0)
    spike_wait_share: float | None = ev("data wait in tail stalls", "{:.0%}")
    warmup_steps: int | None = ev("warm-up steps (run start)", "{}")
    warmup_lost_s: float | None = ev("warm-up beyond steady steps (s)", "{:.2f}")
    warmup_share: float | None = ev("warm-up, of the run's stepping", "{:.0%}")
    first_step_s: float | None = ev("the run's first step (s)", "{:.2f}")
    copy_share: float | None = ev("host-to-device copy / compute", "{:.0%}")
    host_cpu_cores: float | None = ev()  # the whole host, all processes
    cpu_busy_fraction: float | None = ev("host CPU busy (of usable cores)", "{:.0%}")
    main_cpu_cores: float | None = ev("main process CPU (cores)", "{:.2f}")
    workers_cpu_cores: float | None = ev("workers CPU (cores)", "{:.2f}")
    workers_live: float | None = ev()
    other_cpu_cores: float | None = ev("other processes' CPU (cores)", "{:.2f}")
    # the sampler and dashboard servers: neither the job's nor "other processes'"
    monitor_cpu_cores: float | None = ev("the monitor's own processes' CPU (cores)", "{:.2f}")
    others_runnable: float | None = ev("other runnable processes (from the loaders' CPU "
                                       "wait)", "{:.1f}")
    local_ranks: int = ev(default=1)  # this job's ranks on this host, sharing its cores
    # the other processes by scheduling group (NOTE [scheduling groups] in
    # monitor/sampling/groups.py), over the window: each other group's (weight, mean
    # demand in cores), the others' demand in the job's own group, the job's group's weight,
    # and the others' total demand at its 10th and 90th percentile over the scans
    other_groups: tuple[tuple[float, float], ...] | None = ev()
    same_group_demand: float | None = ev("other processes' CPU demand in the job's own "
                                         "scheduling group (cores)", "{:.2f}")
    own_group_weight: float = ev(default=1.0)
    others_demand: tuple[float, float, float] | None = ev(
        "other processes' CPU demand, p10 / mean / p90 (cores)", "{}")
    # each scan's: ((weight, demand) of each other group, demand in the job's own group)
    group_scans: tuple[tuple[tuple[tuple[float, float], ...], float], ...] = ev(default=())
    cpu_per_sample_s: float | None = ev("loading CPU per sample (ms)", "ms")
    wall_per_sample_s: float | None = ev("loading wall per sample, one loader (ms)", "ms")
    runq_per_sample_s: float | None = ev("loading CPU wait per sample (ms)", "ms")
    blocked_per_sample_s: float | None = ev("loading blocked per sample (ms)", "ms")
    loading_cpu_per_wall: float | None = ev("loaders on a CPU (of their time)", "{:.0%}")
    loaders_runq_share: float | None = ev("loaders waiting for a CPU (of their time)",
                                          "{:.0%}")
    loaders_blocked_share: float | None = ev("loaders blocked: storage, locks, sleep (of "
                                             "their time)", "{:.0%}")
    read_per_sample_kb: float | None = ev("loaders' storage reads per sample (KB, block "
                                          "device)", "{:,.1f}")
    # the data wait on batches the workers had made ahead, and that wait a step (monitor/
    # diagnosis/loading.py receive): the loop's own receiving of each batch
    receive_wait_share: float | None = ev("data wait on batches made ahead (the loop "
                                          "receiving them)", "{:.0%}")
    receive_wait_s: float | None = ev("receiving a batch made ahead (ms)", "ms")
    # ... and the loop's thread through that wait: on a CPU, waiting for one; the rest
    # blocked on the workers' hand-off (NOTE [the loop's receive])
    receive_cpu_share: float | None = ev("the loop's thread on a CPU through that wait",
                                         "{:.0%}")
    receive_runq_share: float | None = ev("the loop's thread waiting for a CPU through it",
                                          "{:.0%}")
    # the standard errors of the figures a verdict turns on, over the window's sub-windows
    # and host passes (rules.py: a comparison within NOISE_Z of them is borderline)
    data_wait_se: float | None = ev()
    cpu_busy_se: float | None = ev()
    loaders_runq_se: float | None = ev()
    # an earlier identical run's side of the line, where it decides this run's
    # (assess/same_runs.py, NOTE [identical runs]): {"run", "share", "fed"}
    judged_as: dict[str, Any] | None = ev()
    main_busy_threads: float | None = ev("main process threads at work", "{:.1f}")
    worker_busy_threads: float | None = ev("threads at work a worker", "{:.1f}")
    missing_evidence: tuple[str, ...] = ev(default=())
    usable_cores: int = ev("usable cores (affinity, cgroup quota, SLURM_CPUS_PER_TASK)", "{}", 1)
    # what they do together, in one task alone's units (NOTE [the CPUs' capacity]); None:
    # not read, taken as usable_cores
    capacity_cores: float | None = ev("what the usable CPUs do together (one task alone: 1)",
                                      "{:.2f}")
    physical_cores: int | None = ev()
    capacity_source: str = ev(default="")
    cpu_quota: float | None = ev()
    cpu_throttled: float | None = ev("cgroup periods throttled", "{:.0%}")
    mem_total_mb: float | None = ev()
    mem_available_mb: float | None = ev()
    memory_budget_mb: float | None = ev()
    workload_mem_mb: float | None = ev("workload memory (MB)", "{:,.0f}")
    workload_peak_mb: float | None = ev("workload memory, peak (MB)", "{:,.0f}")
    memory_fraction: float | None = ev("memory used (of budget)", "{:.0%}")
    worker_rss_mb: float | None = ev("RSS per worker (MB)", "{:,.0f}")
    worker_uss_mb: float | None = ev("USS per worker (MB)", "{:,.0f}")

    @property
    def worker_mb(self) -> float | None:
        """A worker's own memory: its USS, else its RSS where USS is not read."""
        return self.worker_uss_mb or self.worker_rss_mb

    @property
    def simulated(self) -> bool:
        return self.accelerator == SIMULATED

    @property
    def starved_share(self) -> float:
        """What the verdicts judge starvation by: the device's own idle between steps where
        CUDA events measured it (a GPU starved while the host was blocked elsewhere is idle
        though its data wait looks small), else the host's data-wait share."""
        return self.device_idle_share if self.device_idle_share is not None \
            else self.data_wait_share

    @property
    def starving_noise(self) -> float:
        """How far past STARVING_SHARE the starved share must be to count as starved: the
        host's data-wait share is judged within NOISE_Z of its standard error as fed (the
        device's own idle, from CUDA events, has no such spread)."""
        return NOISE_Z * (self.data_wait_se or 0.0) if self.device_idle_share is None else 0.0

    @property
    def fed(self) -> bool:
        """The device is fed: its starved share under the line, or within its noise (or as
        an earlier identical run was judged: NOTE [identical runs])."""
        if self.judged_as is not None:
            return bool(self.judged_as["fed"])
        return not self.starved_share >= STARVING_SHARE + self.starving_noise

    @property
    def num_workers(self) -> int:
        return int(self.config.get("num_workers") or 0)

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}


def evidence_rows(values: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, formatted value) for every labelled field, in declaration order."""
    rows = []
    for f in fields(Features):
        label, fmt = f.metadata.get("label"), f.metadata.get("fmt")
        if label:
            rows.append((label, format_value(values.get(f.name), fmt)))
    return rows


def format_value(v: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v * 1000:.2f}" if fmt == "ms" else fmt.format(v)


def _mean(df: pd.DataFrame, col: str) -> float | None:
    if df.empty or col not in df.columns:
        return None
    v = pd.to_numeric(df[col], errors="coerce").dropna()
    return float(v.mean()) if len(v) else None


def _se(values: Any) -> float | None:
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    return float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) >= 3 else None


def _noise(steps: pd.DataFrame, h: pd.DataFrame, usable: int, runq_share: float | None,
           nw: int) -> dict[str, float | None]:
    """The standard errors of the data-wait share (over up to 10 runs of consecutive
    steps), the host's CPU busy and the loaders' CPU wait share (over the host passes)."""
    out: dict[str, float | None] = {"data_wait_se": None, "cpu_busy_se": None,
                                    "loaders_runq_se": None}
    n = len(steps)
    if n >= 15:
        k = min(10, n // 5)
        parts = [steps.iloc[i * n // k:(i + 1) * n // k] for i in range(k)]
        out["data_wait_se"] = _se([analysis.data_wait_share(p) for p in parts])
    rows = h.drop_duplicates("ts") if not h.empty and "ts" in h.columns else h
    ncores = _ncores(rows)
    if ncores and "cpu_total_pct" in rows.columns:
        out["cpu_busy_se"] = _se(rows["cpu_total_pct"] / 100 * ncores / max(1, usable))
    col = "proc_runq_pct" if nw == 0 else "workers_runq_pct"
    if runq_share is not None and not h.empty and col in h.columns:
        mean, se = _mean(h, col), _se(h[col])
        if mean and se is not None:
            out["loaders_runq_se"] = runq_share * se / mean
    return out


def workload_memory(host: pd.DataFrame) -> pd.Series:
    """The workload's memory per host sample, MB: main RSS + workers' USS (what each worker
    adds beyond the pages it shares with its parent), or their RSS where USS is not read."""
    if host.empty or "proc_rss_mb" not in host.columns:
        return pd.Series(dtype=float)
    rss = pd.to_numeric(host["proc_rss_mb"], errors="coerce")
    return (rss + analysis.workers_memory_mb(host).fillna(0.0)).dropna()


def _ncores(h: pd.DataFrame) -> int | None:
    """The host's core count, from the first stored per-core reading (None: none)."""
    if h.empty or "cpu_per_core" not in h.columns:
        return None
    stored = h["cpu_per_core"].dropna()
    return len(json.loads(stored.iloc[0])) if len(stored) else None


def _cpu(h: pd.DataFrame) -> dict[str, float | None]:
    """Host, main-process and worker CPU in cores, over the window's host samples."""
    pct = {c: _mean(h, c) for c in ("cpu_total_pct", "proc_cpu_pct", "workers_cpu_pct",
                                    "workers", "monitor_cpu_pct")}
    ncores = _ncores(h)
    host = pct["cpu_total_pct"] / 100 * ncores if pct["cpu_total_pct"] is not None \
        and ncores else None
    extra = {c: _mean(h, c) for c in ("proc_runq_pct", "workers_runq_pct",
                                      "workers_reaped_cpu_pct", "proc_read_kb_s",
                                      "workers_read_kb_s")}
    main = pct["proc_cpu_pct"] / 100 if pct["proc_cpu_pct"] is not None else None
    workers = pct["workers_cpu_pct"] / 100 if pct["workers_cpu_pct"] is not None else None
    if workers is not None and extra["workers_reaped_cpu_pct"]:  # short-lived workers' tail
        workers += extra["workers_reaped_cpu_pct"] / 100
    mine = pct["monitor_cpu_pct"] / 100 if pct["monitor_cpu_pct"] is not None else None
    other = max(0.0, host - (main or 0.0) - (workers or 0.0) - (mine or 0.0)) \
        if host is not None else None

    def cores(col: str) -> float | None:
        return extra[col] / 100 if extra[col] is not None else None

    return {"host": host, "main": main, "workers": workers, "other": other, "monitor": mine,
            "live": pct["workers"], "main_runq": cores("proc_runq_pct"),
            "workers_runq": cores("workers_runq_pct"), "main_read": extra["proc_read_kb_s"],
            "workers_read": extra["workers_read_kb_s"]}


def _groups(h: pd.DataFrame) -> dict[str, Any]:
    """The window's scans of the other processes (NOTE [scheduling groups]): each other
    group's weight and mean demand, the own group's others, and the spread of the total."""
    out: dict[str, Any] = {"other_groups": None, "same_group_demand": None,
                           "own_group_weight": 1.0, "others_demand": None, "group_scans": ()}
    if h.empty or "others_groups" not in h.columns:
        return out
    scans = [json.loads(t) for t in h.drop_duplicates("ts")["others_groups"].dropna()]
    if not scans:
        return out
    n = len(scans)
    other: dict[str, list[float]] = {}
    same, totals, each = 0.0, [], []
    for s in scans:
        total, mine, theirs = 0.0, 0.0, []
        for key, w, demand, *_ in s["groups"]:
            total += demand
            if key == s["own"]:
                same += demand / n
                mine += demand
            else:
                g = other.setdefault(key, [w, 0.0])
                g[1] += demand / n
                theirs.append((w, demand))
        totals.append(total)
        each.append((tuple(theirs), mine))
    totals.sort()
    mean = sum(totals) / n
    out.update(other_groups=tuple((w, d) for w, d in other.values()), same_group_demand=same,
               own_group_weight=float(scans[-1].get("own_weight") or 1.0),
               others_demand=(totals[int(0.1 * (n - 1))], mean, totals[int(0.9 * (n - 1) + 0.5)]),
               group_scans=tuple(each))
    return out


def _others_runnable(cpu: dict, nw: int, usable: int) -> float | None:
    """How many other processes were runnable while a loader was, on average: under the
    fair scheduler T runnable tasks on U cores get U/T of a core each, so a loader on a CPU
    for a share s of its runnable time saw T = U / s of them; the others are T less this
    job's own (the loader, its sibling workers while runnable, the main process). None
    without schedstat, or where the loaders barely waited (T <= U: no one was short)."""
    on, q = (cpu["main"], cpu["main_runq"]) if nw == 0 else (cpu["workers"], cpu["workers_runq"])
    if on is None or q is None or on <= 0 or q / (on + q) < CONTENTION_MIN_WAIT:
        return None
    t = usable * (on + q) / on
    ours = 1.0
    if nw > 0:
        live = max(1.0, cpu["live"] or nw)
        ours += (live - 1) * min(1.0, (on + q) / live) + (cpu["main"] or 0.0) + \
            (cpu["main_runq"] or 0.0)
    return max(0.0, t - ours)


def _memory(h: pd.DataFrame, budget_mb: float | None) -> dict[str, float | None]:
    series = workload_memory(h)
    shm = None
    if not h.empty and "shm_used_mb" in h.columns and h["shm_used_mb"].notna().any():
        shm = float(h["shm_used_mb"].max() - h["shm_used_mb"].min())
    used = float(series.mean()) + (shm or 0.0) if len(series) else None
    total = _mean(h, "mem_total_mb")
    avail = float(h["mem_available_mb"].min()) \
        if not h.empty and h["mem_available_mb"].notna().any() else None
    # against a budget: what the workload uses; against the machine: what everything uses
    limit = budget_mb or total
    judged = used if budget_mb else (total - avail if total and avail is not None else None)
    return {"used": used, "peak": float(series.max()) if len(series) else None,
            "total": total, "available": avail,
            "fraction": judged / limit if judged is not None and limit else None}


def features(
    steps: pd.DataFrame, host: pd.DataFrame, config: dict[str, Any], budget: CpuBudget,
    accelerator: str = SIMULATED, memory_budget: float | None = None,
    warmup: dict[str, Any] | None = None,
) -> Features:
    """Measure a window of one configuration (steps and host samples over the same time);
    `warmup`: the run's own warm-up (analysis.warmup), for a run's steady state."""
    s = analysis.summarize(steps)
    start, end = analysis.span(steps) if not steps.empty else (0.0, 0.0)
    busy = analysis.busy_series(steps, start=start, end=end)
    period, duty = analysis.sawtooth(busy)
    gaps, gap_med = analysis.idle_gaps(steps)
    n_epochs, stall, first, in_step = analysis.epoch_stalls(steps,
                                                            step_too=accelerator == "cpu")
    span_s = max(end - start, 1e-9)
    h = host[(host["ts"] >= start) & (host["ts"] <= end)] if not host.empty else host
    cpu = _cpu(h)
    nw = int(config.get("num_workers") or 0)
    ahead, receive_s, receipt = loading.receive(steps) if nw > 0 else (None, None, None)
    cpu_s, wall_s = loading.loading(steps, nw, cpu, span_s, s.data_wait_share, ahead)
    sampled = not h.empty and "proc_cpu_pct" in h.columns and h["proc_cpu_pct"].notna().any()
    split = loading.split(steps, nw, cpu, span_s, cpu_s, wall_s, sampled)

    def share(x: float | None) -> float | None:
        return x / wall_s if x is not None and wall_s else None
    copy = None
    if "copy_s" in steps.columns and steps["copy_s"].notna().any():
        copy = float(steps["copy_s"].sum() / max(steps["compute_s"].sum(), 1e-9))
    budget_mb = memory_budget_mb(memory_budget)
    mem = _memory(h, budget_mb)
    live = cpu["live"]

    def per(col: str) -> float | None:
        v = _mean(h, col)
        return v / live if v is not None and live else None

    empty = steps.empty
    tail = analysis.step_tail(steps)
    wu = warmup or {}
    dev = analysis.device_timing(steps)  # CUDA events: the device's own clock
    busy_mean, busy_cv = (dev["busy_mean"], dev["busy_cv"]) if dev else \
        (s.device_busy_mean, s.device_busy_cv)
    return Features(
        config=dict(config), accelerator=accelerator, steps=s.steps, window_s=s.window_s,
        between_epochs_s=s.between_epochs_s,
        throughput=s.throughput, data_wait_share=s.data_wait_share,
        device_busy_mean=busy_mean, device_busy_cv=busy_cv,
        device_busy_source="CUDA events" if dev else "host timing",
        device_idle_share=dev["idle_share"] if dev else None,
        device_idle_per_step_s=dev["idle_per_step_s"] if dev else None,
        idle_gaps=gaps, idle_gap_median_s=gap_med, period_s=period, duty_cycle=duty,
        wait_per_step_s=math.nan if empty else float(steps["wait_s"].mean()),
        compute_per_step_s=math.nan if empty else float(steps["compute_s"].median()),
        epoch_starts=n_epochs, epoch_stall_s=stall, epoch_stall_step_s=in_step,
        epoch_stall_share=math.nan if empty else stall / span_s, first_batch_s=first,
        step_p50_s=tail["p50"], step_p99_s=tail["p99"],
        tail_ratio=(tail["p99"] / tail["p50"]) if tail["p50"] else None,
        spike_steps=int(tail["spikes"] or 0), spike_wait_share=tail["spike_wait_share"],
        warmup_steps=wu.get("steps"), warmup_lost_s=wu.get("lost_s"),
        warmup_share=wu.get("share"), first_step_s=wu.get("first_step_s"),
        copy_share=copy, host_cpu_cores=cpu["host"],
        cpu_busy_fraction=cpu["host"] / budget.usable if cpu["host"] is not None else None,
        main_cpu_cores=cpu["main"], workers_cpu_cores=cpu["workers"], workers_live=live,
        other_cpu_cores=cpu["other"], monitor_cpu_cores=cpu["monitor"],
        others_runnable=_others_runnable(cpu, nw, budget.usable), cpu_per_sample_s=cpu_s,
        wall_per_sample_s=wall_s,
        runq_per_sample_s=split["runq"], blocked_per_sample_s=split["blocked"],
        loading_cpu_per_wall=share(cpu_s), loaders_runq_share=share(split["runq"]),
        loaders_blocked_share=share(split["blocked"]), read_per_sample_kb=split["read_kb"],
        receive_wait_share=ahead, receive_wait_s=receive_s,
        receive_cpu_share=receipt[0] if receipt else None,
        receive_runq_share=receipt[1] if receipt else None,
        **_noise(steps, h, budget.usable, share(split["runq"]), nw),
        main_busy_threads=_mean(h, "proc_busy_threads"),
        worker_busy_threads=_mean(h, "workers_busy_threads"),
        missing_evidence=split["missing"],
        usable_cores=budget.usable, cpu_quota=budget.quota, cpu_throttled=budget.throttled,
        capacity_cores=budget.capacity, physical_cores=budget.physical,
        capacity_source=budget.capacity_source,
        mem_total_mb=mem["total"], mem_available_mb=mem["available"],
        memory_budget_mb=budget_mb, workload_mem_mb=mem["used"],
        workload_peak_mb=mem["peak"], memory_fraction=mem["fraction"],
        worker_rss_mb=per("workers_rss_mb"), worker_uss_mb=per("workers_uss_mb"),
        **_groups(h),
    )
