"""The bound model: what throughput any loader setting can reach, from one measured window.

Symbols, and what each is measured from (Features):

    c   loading CPU seconds per sample, one loader process. num_workers=0: main-process CPU
        x window / samples (the simulated device sleeps, so that CPU is loading); with
        workers: workers' CPU x window / samples. Capped at w.
    w   loading wall seconds per sample, one loader process. num_workers=0: Σ data wait /
        samples; with workers, only when they are saturated (share >= STARVING_SHARE, and
        not ahead of the loop: monitor/diagnosis/loading.py): num_workers x window /
        samples.
    U   usable cores, in a lone task's units: cap(U) (below).
    K   cores for N workers. Where the sampler measured the other processes by scheduling
        group (NOTE [scheduling groups] in monitor/sampling/groups.py), the fair scheduler
        as it shares: U cores go to the groups by weight, none past a group's demand, what
        one leaves to the rest (waterfill); the job's group's share goes to its tasks alike
        (N loaders wanting c / (c + l) of a core each, the main process m, the others in the
        job's own group). So more workers take CPU from a neighbour in the job's group, and
        none from one in another (another session's job under autogroups, another cgroup):
        beside another session's job, 2 → 6 workers was predicted x1.57 by the per-task
        model and measured x0.98 bare. Without that measurement: usable cores - main
        process CPU - other processes' CPU, at least 0.5, or where the loaders waited for a
        CPU the per-task share, when larger: N workers beside M other runnable processes
        (from the loaders' CPU wait, features.py) and the main process's m get
        K(N) = N U / max(U, N + m + M)   (cores_for; with L ranks on the host, L (N + m))
    s0  the main process's share of a core while runnable (main_share): the same sharing
        with one task wanting a whole core; 1 where nothing was measured.
    l   blocked seconds per sample, one loader: w - c - q, where q is the time the loader
        was runnable but waiting for a CPU (/proc schedstat, the sampler measures it). What
        is left is storage, a lock or a sleep: more loaders overlap it. Unknown without
        schedstat, then 0 (the model never invents storage time).
    d   device seconds per batch at the measured batch size B: the median compute per step.
        On a real device (CUDA, or a CPU step) d scales with the batch size, d(b) = d b / B;
        the simulated device takes d whatever the batch. A step on the host's CPU also
        takes longer as the loaders' CPU beside it grows (NOTE [a step on the loaders'
        CPUs]): at num_workers=0 it gets back what the workers took.
    o   main-process seconds per step with workers on (receive, unpickle, rebuild the
        tensors, the loop), in series with the step: its CPU per step o_cpu (measured beside
        workers, outside its step: at most the data wait a step; MAIN_RECEIVE_S a batch from
        a window at num_workers=0, 0.55-0.7 ms here)
        spread by its share of a core, plus the hand-offs a batch takes between the worker
        and the main process (the tensors' descriptors passed through the worker's sharer
        thread), each waiting for a CPU as busy as the loaders and the others keep them:
        o(N) = o_cpu / s0(N) + h B(N), B(N) = min(1, (K(N) + others' CPU) / U), h =
        MAIN_HANDOFF_S; at least the measured wait per step when the device is fed, or
        where most of the wait was for batches the workers had made ahead, that wait a
        step (the loop's own receiving: NOTE [the loop's receive] in costs.py), else
        DEFAULT_OVERHEAD_S. It bounds every setting: no prediction passes b / (d + o).
        Measured bare on the quiet 2-core box (bench/repro/loader.py, 16 samples of 0.7 ms,
        a 5 ms step): 2,094 samples/s at 2 workers, 1,950-2,060 at 3 to 6, the CPUs 1.2 of
        2 busy: 7.6 ms a batch, 2.3 ms beyond the step, of which 0.55 ms main-process CPU;
        with samples that cost nothing (the CPUs idle) 0.9 ms.

Throughput in samples/s at N workers and batch size b:

    N = 0:  b / (b (c / s0 + l) + d(b))             loading and compute take turns
    N > 0:  min( b / (d(b) + o(N)),                  "device"
                 N / (c + l),                        "workers"
                 K / c )                             "cores"

The limit named is the argmin; "workers" within 5% of "cores" is reported as "cores" (a tie:
more workers would not get more CPU).

The CPUs in one task alone's units (NOTE [the CPUs' capacity] in
monitor/sampling/capacity.py): k busy CPUs do cap(k) of a lone task's work (capacity_at: a
core each up to the physical cores, SMT siblings and shared vCPUs the measured rest; a
2-vCPU VM gives about 1.5). U is cap(U), measured by `doctor` and kept, else from the
topology, else the CPU count; c and o_cpu, measured at the window's k_w busy CPUs, are taken
to a lone task's speed, c x cap(k_w) / k_w; the fallback K scales by cap(U) / U. So a window
at one worker no longer predicts two CPUs' worth for two workers on a box whose two do 1.5,
and a window with both busy predicts what it measured. What remains is learned: a
prediction for a num_workers other than the window's own is multiplied by its limit's scale:
what this machine's earlier outcomes of that limit measured against their predictions
(monitor/assess/outcomes.py learns them from each applied change; 1 until one is measured).

The range: the others' demand varied while the window was measured (a neighbour that runs
and pauses); the prediction is made at each of the window's scans of them, its mean the
prediction and its p10 and p90 the range (span), and advice whose low end gains less than
MIN_GAIN says it cannot promise a gain (rules.py). Measured by bench/predictions.py
(docs/benchmarks.md).

The base of a gain: the run was measured under the monitor, whose own processes (the
sampler, `monitor run`'s relay) took CPU in the job's own scheduling group (they share its
session); a bare run has it. Where the groups were measured, a gain is a percentage of the
window's throughput times bare_factor(): the model at the window's own setting with the
monitor's CPU as demand in the job's group against without it (rules.py states the base in
the advice, `base_throughput`). Where they were not, the monitor's share cannot be told from
the others' and the base is the window's throughput. The probe's cost in the loop (1.4 µs a
step quiet, 3.2 µs with a core busy: bench/probe_cost.py) is below the figures' resolution.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from monitor.diagnosis.features import Features
from monitor.diagnosis.loading import made_ahead
from monitor.diagnosis.main_cpu import main_per_step, step_threads
from monitor.thresholds import (
    CORES_TIE_X,
    DEFAULT_OVERHEAD_S,
    KNEE_SHARE,
    MAIN_HANDOFF_S,
    MAIN_IDLE_CORES,
    MIN_LOADER_CORES,
    STARVING_SHARE,
)

# NOTE [a step on the loaders' CPUs]
# Where the step itself runs on the host's CPU (no GPU: a model's forward and backward on
# torch's intra-op pool), the loaders take their cores from the step, and a pool's P
# threads move in lockstep: the step waits whenever one of them waits. Beside loaders
# keeping L cores of U busy (their CPU, and the other processes'), the step has all its
# threads on a CPU (1 - L / U) ^ P of the time, so d at a setting is d x free(L then) /
# free(L now). With workers on both sides the loaders' CPU is what feeds the same rate, and
# d stands; at num_workers=0 their CPU goes (loading takes turns with the step); from a
# window at 0, theirs at a setting is its rate x c, at most K. Measured bare on the 2-core
# box (a 3-layer MLP on two threads, 32 samples a batch): the step took 39.5 ms beside two
# workers using 0.29 cores and 25.0 ms without them (x1.58; the lockstep x1.43, a
# proportional share x1.20); a torchvision mobilenet step 60.9 ms beside 0.16 cores of
# workers, 50.3 ms alone (x1.21; the lockstep x1.20). Without it, num_workers=0 was
# predicted at the step's time beside the workers: 610 samples/s from 728 where it measured
# 926-973. A step that sleeps, or runs on a GPU, keeps d.


@dataclass(frozen=True, slots=True)
class BoundModel:
    """The symbols of the module docstring: cpu_s = c, latency_s = l, device_s = d at
    batch_size = B, device_scales (real device), overhead_s = o, cores = K."""

    cpu_s: float
    latency_s: float
    device_s: float
    batch_size: int
    device_scales: bool
    overhead_s: float
    cores: float
    fit_workers: int = 0  # the window's own num_workers: its prediction is not scaled
    others_runnable: float | None = None  # M; None: no contention measured
    usable: float = 1.0  # U
    main_runnable: float = 0.0  # m
    local_ranks: int = 1  # L
    scales: dict[str, float] = field(default_factory=dict)  # limit -> measured / predicted
    # the scheduling groups (NOTE [scheduling groups] in monitor/sampling/groups.py): the
    # other groups' (weight, demand), the others in the job's own group, its weight; None:
    # not measured, every task shares alike (K(N) above)
    groups: tuple[tuple[float, float], ...] | None = None
    same_demand: float = 0.0
    own_weight: float = 1.0
    # each scan's other groups and own-group demand: a prediction is the mean over them of
    # the prediction at each (a neighbour that runs and pauses gives the job its share
    # now and then, not a share of its mean), its range their p10 and p90
    scans: tuple[tuple[tuple[tuple[float, float], ...], float], ...] = ()
    main_cpu_s: float | None = None  # o_cpu: main-process CPU per step beside workers
    other_cpu: float = 0.0  # the others' CPU over the window (cores): how busy the CPUs are
    monitor_cpu: float = 0.0  # the monitor's own processes' CPU over the window (cores)
    # a step on the host's CPU (P, NOTE [a step on the loaders' CPUs]): the main process's
    # threads it runs on, 0 where it does not (a device, a sleep); the loaders' CPU beside it
    step_threads: float = 0.0
    loaders_cpu: float = 0.0

    def _share(self, tasks: list[float]) -> list[float]:
        """The cores each of this job's `tasks` (their demands, in cores) gets beside the
        others: the job's group takes its weighted share of U from the other groups, its
        tasks share that alike with the others in it (waterfill, both levels)."""
        same = _split(self.same_demand)
        own = sum(tasks) + sum(same)
        if self.groups is None:
            return tasks
        got = waterfill(self.usable, [(self.own_weight, min(own, self.usable))]
                        + [(w, min(d, self.usable)) for w, d in self.groups])[0]
        return waterfill(got, [(1.0, t) for t in tasks] + [(1.0, t) for t in same])[
            :len(tasks)]

    def main_share(self, num_workers: int) -> float:
        """The share of a core the main process gets while it is runnable (1: all of one):
        loading at num_workers=0; receiving batches beside num_workers loaders."""
        if self.groups is None:
            if self.others_runnable is None:
                return 1.0
            t = self.local_ranks * (num_workers + 1) + self.others_runnable
            return min(1.0, self.usable / max(1.0, t))
        loaders = [self.loader_demand] * num_workers
        return min(1.0, self._share([*loaders, 1.0])[-1])

    @property
    def loader_demand(self) -> float:
        """A loader's demand for a CPU: the share of its time it computes (c / (c + l))."""
        per = self.cpu_s + self.latency_s
        return self.cpu_s / per if per > 0 else 1.0

    def overhead_at(self, num_workers: int) -> float:
        """o at num_workers: the main process's CPU per step spread by its share of a core,
        or the measured (fed) wait per step where it was not measured."""
        if self.main_cpu_s is None:
            return self.overhead_s
        busy = min(1.0, (self.cores_for(num_workers) + self.other_cpu) / self.usable)
        return max(self.overhead_s, self.main_cpu_s / self.main_share(num_workers)
                   + MAIN_HANDOFF_S * busy)

    def device_time(self, batch_size: int) -> float:
        return self.device_s * (batch_size / self.batch_size if self.device_scales else 1.0)

    def _free(self, busy: float) -> float:
        """The share of the time a step on P threads in lockstep has all of them on a CPU,
        beside `busy` cores of other work spread over U: (1 - busy / U) ^ P, each thread's
        share at least 0.05 (a step never stops)."""
        return max(0.05, 1.0 - min(busy, self.usable) / self.usable) ** self.step_threads

    def step_time(self, num_workers: int, b: int, loaders_cpu: float | None = None) -> float:
        """d at a setting: a step on the host's CPU waits for the cores the loaders take
        beside it (NOTE [a step on the loaders' CPUs]); `loaders_cpu`: theirs at the
        setting, from a window at num_workers=0. A device's step, or a sleep: d."""
        d = self.device_time(b)
        if not self.step_threads or (num_workers > 0) == (self.fit_workers > 0):
            return d
        if num_workers == 0:  # the loaders' CPU leaves with them; loading takes turns
            return d * self._free(self.loaders_cpu + self.other_cpu) / self._free(self.other_cpu)
        return d * self._free(self.other_cpu) / self._free((loaders_cpu or 0.0)
                                                           + self.other_cpu)

    def cores_for(self, num_workers: int) -> float:
        """K at num_workers: with the scheduling groups measured, what the loaders get of
        their group's share (waterfill); else the idle cores, or the fair scheduler's share
        where larger."""
        if num_workers <= 0:
            return self.cores
        if self.groups is not None:
            loaders = [self.loader_demand] * num_workers
            main = min(1.0, self.main_runnable)
            return max(MIN_LOADER_CORES, sum(self._share([*loaders, main])[:num_workers]))
        if self.others_runnable is None:
            return self.cores
        n, m, ranks = num_workers, self.main_runnable, self.local_ranks
        # the measured others include this host's sibling ranks at the window's setting
        others = max(0.0, self.others_runnable - (ranks - 1) * (self.fit_workers + m))
        t = ranks * (n + m) + others
        return max(self.cores, n * self.usable / max(self.usable, t))

    def predict(self, num_workers: int, batch_size: int | None = None) -> tuple[float, str]:
        """(samples/s, limit) for a setting: limit is 'device', 'workers', 'cores' or
        'main process' (num_workers=0: loading and compute take turns)."""
        each = self._each(num_workers, batch_size)
        rate = sum(r for r, _ in each) / len(each)
        limits = [lim for _, lim in each]
        limit = max(set(limits), key=limits.count)
        if num_workers != self.fit_workers:
            rate *= self.scales.get(limit, 1.0)
        return rate, limit

    def span(self, num_workers: int, batch_size: int | None = None
             ) -> tuple[float, float] | None:
        """The p10 and p90 of the prediction over the window's scans (None: under two)."""
        if len(self.scans) < 2:
            return None
        rates = sorted(r for r, _ in self._each(num_workers, batch_size))
        n = len(rates)
        k = self.scales.get(self.predict(num_workers, batch_size)[1], 1.0) \
            if num_workers != self.fit_workers else 1.0
        return rates[int(0.1 * (n - 1))] * k, rates[int(0.9 * (n - 1) + 0.5)] * k

    def bare_factor(self) -> float:
        """How much faster the window's own setting would have run without the monitor: the
        model at it with the monitor's CPU as demand in the job's own scheduling group (where
        `monitor run` and the dashboard's workloads run) against without. 1 where the groups
        were not measured: the monitor's cost cannot be separated from the others' then."""
        if self.groups is None or self.monitor_cpu <= 0:
            return 1.0

        def at(extra: float) -> float:
            m = replace(self, same_demand=self.same_demand + extra,
                        scans=tuple((g, s + extra) for g, s in self.scans))
            each = m._each(self.fit_workers, None)
            return sum(r for r, _ in each) / len(each)

        with_monitor = at(self.monitor_cpu)
        return max(1.0, at(0.0) / with_monitor) if with_monitor > 0 else 1.0

    def _each(self, num_workers: int, batch_size: int | None) -> list[tuple[float, str]]:
        if not self.scans:
            return [self._raw(num_workers, batch_size)]
        return [replace(self, groups=g, same_demand=s, scans=())._raw(num_workers, batch_size)
                for g, s in self.scans]

    def _raw(self, num_workers: int, batch_size: int | None) -> tuple[float, str]:
        b = batch_size or self.batch_size
        d = self.device_time(b)
        per_sample = self.cpu_s + self.latency_s
        if num_workers == 0:  # the main process loads, at its share of a core
            d = self.step_time(0, b)
            load = b * (self.cpu_s / self.main_share(0) + self.latency_s)
            return b / (load + d), ("main process" if load > d else "device")
        rates = {
            "device": b / (d + self.overhead_at(num_workers)),
            "workers": num_workers / per_sample if per_sample > 0 else math.inf,
            "cores": self.cores_for(num_workers) / self.cpu_s if self.cpu_s > 0 else math.inf,
        }
        for _ in range(3 if self.step_threads and self.fit_workers == 0 else 0):
            # the loaders' CPU at the rate they feed slows a step on the same CPUs
            busy = min(self.cores_for(num_workers), min(rates.values()) * self.cpu_s)
            rates["device"] = b / (self.step_time(num_workers, b, busy)
                                   + self.overhead_at(num_workers))
        limit = min(rates, key=rates.get)
        if limit == "workers" and rates["cores"] <= CORES_TIE_X * rates["workers"]:
            limit = "cores"
        return rates[limit], limit


def waterfill(capacity: float, claims: list[tuple[float, float]]) -> list[float]:
    """How the fair scheduler splits `capacity` cores between claims of (weight, demand):
    in proportion to weight, none past its demand, what one leaves going to the rest."""
    out = [0.0] * len(claims)
    left = capacity
    open_ = [i for i, (w, d) in enumerate(claims) if d > 0 and w > 0]
    while open_ and left > 1e-9:
        rate = left / sum(claims[i][0] for i in open_)
        full = [i for i in open_ if claims[i][1] - out[i] <= claims[i][0] * rate]
        if not full:
            for i in open_:
                out[i] += claims[i][0] * rate
            break
        for i in full:
            left -= claims[i][1] - out[i]
            out[i] = claims[i][1]
        open_ = [i for i in open_ if i not in full]
    return out


def _split(demand: float) -> list[float]:
    """A group's demand as tasks of at most one core each."""
    n = math.ceil(demand - 1e-9) if demand > 0 else 0
    return [demand / n] * n if n else []


def loading_latency(f: Features) -> float | None:
    """l: blocked seconds per sample of loading (measured: wall - CPU - CPU wait), or None
    when the split is not measured."""
    return f.blocked_per_sample_s


def fit_bound(f: Features, scales: dict[str, float] | None = None) -> BoundModel | None:
    """The bound model for a window, or None when it cannot be measured (too few steps, or
    workers fed the device so well that the loading cost is hidden); `scales`: this
    machine's measured / predicted for other settings, by limit."""
    if f.steps < 3 or f.cpu_per_sample_s is None or not f.config.get("batch_size"):
        return None
    nw = f.num_workers
    main = f.main_cpu_cores if nw > 0 and f.main_cpu_cores is not None else MAIN_IDLE_CORES
    # the cores other processes leave, shared alike by this job's ranks on this host (a
    # request goes to every rank, so each rank's workers get its share, not the host)
    share = (f.usable_cores - (f.other_cpu_cores or 0.0)) / max(1, f.local_ranks)
    cores = max(MIN_LOADER_CORES, share - main)
    overhead = DEFAULT_OVERHEAD_S
    if nw > 0 and f.data_wait_share < STARVING_SHARE:
        overhead = max(overhead, f.wait_per_step_s)
    elif nw > 0 and made_ahead(f.receive_wait_share) and f.receive_wait_s:
        # the wait was for batches made ahead: the loop's own (NOTE [the loop's receive])
        overhead = max(overhead, f.receive_wait_s)
    # in units of one task alone (NOTE [the CPUs' capacity]): the CPU seconds measured at
    # the window's busy CPUs did `speed` of a lone task's work each
    usable, speed, main_cpu = float(f.usable_cores), 1.0, main_per_step(f)
    cap = f.capacity_cores
    if cap is not None and cap < usable - 1e-6:
        busy = min(usable, max(1.0, f.host_cpu_cores or 1.0))
        speed = capacity_at(busy, cap, f.usable_cores, f.physical_cores) / busy
        cores *= cap / usable
        usable = cap
        main_cpu = main_cpu * speed if main_cpu is not None else None
    return BoundModel(
        groups=f.other_groups, same_demand=f.same_group_demand or 0.0,
        scans=f.group_scans,
        own_weight=f.own_group_weight, main_cpu_s=main_cpu,
        other_cpu=f.other_cpu_cores or 0.0, monitor_cpu=f.monitor_cpu_cores or 0.0,
        cpu_s=max(f.cpu_per_sample_s * speed, 1e-7), latency_s=loading_latency(f) or 0.0,
        device_s=max(f.compute_per_step_s, 1e-6), batch_size=int(f.config["batch_size"]),
        device_scales=not f.simulated, overhead_s=overhead, cores=cores, fit_workers=nw,
        scales=dict(scales or {}), others_runnable=f.others_runnable,
        usable=usable, main_runnable=main, local_ranks=max(1, f.local_ranks),
        step_threads=step_threads(f), loaders_cpu=f.workers_cpu_cores or 0.0,
    )


def capacity_at(k: float, cores: float, usable: int, physical: int | None) -> float:
    """cap(k): what k busy CPUs of `usable` do together (`cores` for all of them), in units
    of one task alone. The scheduler spreads tasks over cores before SMT siblings, so up to
    `physical` each is a core; past that each further CPU adds the rest evenly (without a
    topology, evenly from the first)."""
    if k <= 1 or usable <= 1:
        return min(k, cores)
    k = min(k, float(usable))
    p = physical if physical and physical < usable else 1
    if k <= p:
        return k
    return p + (cores - p) * (k - p) / (usable - p)


def best_workers(model: BoundModel, max_workers: int, batch_size: int | None = None) -> int:
    """The smallest num_workers within KNEE_SHARE of the best predicted throughput."""
    preds = {n: model.predict(n, batch_size)[0] for n in range(0, max_workers + 1)}
    best = max(preds.values())
    return min(n for n, p in preds.items() if p >= KNEE_SHARE * best)
