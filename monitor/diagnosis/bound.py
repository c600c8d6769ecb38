"""The bound model: what throughput any loader setting can reach, from one measured window.

Symbols, and what each is measured from (Features):

    c   loading CPU seconds per sample, one loader process. num_workers=0: main-process CPU
        x window / samples (the simulated device sleeps, so that CPU is loading); with
        workers: workers' CPU x window / samples. Capped at w.
    w   loading wall seconds per sample, one loader process. num_workers=0: Σ data wait /
        samples; with workers, only when they are saturated (share >= STARVING_SHARE):
        num_workers x window / samples.
    K   cores left for workers: usable cores (affinity, cgroup quota) - main process CPU -
        other processes' CPU, at least 0.5. Where the loaders waited for a CPU (contention),
        the fair scheduler's share instead, when larger: U cores shared by T runnable tasks
        give each U/T, so N workers beside M other runnable processes (measured from the
        loaders' CPU wait, features.py) and the main process's m get
        K(N) = N U / max(U, N + m + M)   (cores_for; with L ranks on the host, L (N + m))
        More workers take that share from the other jobs: the advice says so.
    l   blocked seconds per sample, one loader: w - c - q, where q is the time the loader
        was runnable but waiting for a CPU (/proc schedstat, the sampler measures it). What
        is left is storage, a lock or a sleep: more loaders overlap it. Unknown without
        schedstat, then 0 (the model never invents storage time).
    d   device seconds per batch at the measured batch size B: the median compute per step.
        On a real device (CUDA, or a CPU step) d scales with the batch size, d(b) = d b / B;
        the simulated device takes d whatever the batch.
    o   main-process seconds per step with workers on (collate, queue, unpickle): the
        measured wait per step when the device is fed, else DEFAULT_OVERHEAD_S.

Throughput in samples/s at N workers and batch size b:

    N = 0:  b / (b (c + l) + d(b))                  loading and compute take turns
    N > 0:  min( b / (d(b) + o),                     "device"
                 N / (c + l),                        "workers"
                 K / c )                             "cores"

The limit named is the argmin; "workers" within 5% of "cores" is reported as "cores" (a tie:
more workers would not get more CPU). The model assumes loaders scale linearly on the cores
(a 2-vCPU VM gives about 1.5), so predictions past the first core run 10-25% high there. So
a prediction for a num_workers other than the window's own is multiplied by its limit's scale:
what this machine's earlier outcomes of that limit measured against their predictions
(monitor/assess/outcomes.py learns them from each applied change; 1 until one is measured).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from monitor.diagnosis.features import Features
from monitor.thresholds import (
    CORES_TIE_X,
    DEFAULT_OVERHEAD_S,
    KNEE_SHARE,
    MAIN_IDLE_CORES,
    MIN_LOADER_CORES,
    STARVING_SHARE,
)


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

    def device_time(self, batch_size: int) -> float:
        return self.device_s * (batch_size / self.batch_size if self.device_scales else 1.0)

    def cores_for(self, num_workers: int) -> float:
        """K at num_workers: the idle cores, or the fair scheduler's share where larger."""
        if self.others_runnable is None or num_workers <= 0:
            return self.cores
        n, m, ranks = num_workers, self.main_runnable, self.local_ranks
        # the measured others include this host's sibling ranks at the window's setting
        others = max(0.0, self.others_runnable - (ranks - 1) * (self.fit_workers + m))
        t = ranks * (n + m) + others
        return max(self.cores, n * self.usable / max(self.usable, t))

    def predict(self, num_workers: int, batch_size: int | None = None) -> tuple[float, str]:
        """(samples/s, limit) for a setting: limit is 'device', 'workers', 'cores' or
        'main process' (num_workers=0: loading and compute take turns)."""
        rate, limit = self._raw(num_workers, batch_size)
        if num_workers != self.fit_workers:
            rate *= self.scales.get(limit, 1.0)
        return rate, limit

    def _raw(self, num_workers: int, batch_size: int | None) -> tuple[float, str]:
        b = batch_size or self.batch_size
        d = self.device_time(b)
        per_sample = self.cpu_s + self.latency_s
        if num_workers == 0:
            load = b * per_sample
            return b / (load + d), ("main process" if load > d else "device")
        rates = {
            "device": b / (d + self.overhead_s),
            "workers": num_workers / per_sample if per_sample > 0 else math.inf,
            "cores": self.cores_for(num_workers) / self.cpu_s if self.cpu_s > 0 else math.inf,
        }
        limit = min(rates, key=rates.get)
        if limit == "workers" and rates["cores"] <= CORES_TIE_X * rates["workers"]:
            limit = "cores"
        return rates[limit], limit


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
    return BoundModel(
        cpu_s=max(f.cpu_per_sample_s, 1e-7), latency_s=loading_latency(f) or 0.0,
        device_s=max(f.compute_per_step_s, 1e-6), batch_size=int(f.config["batch_size"]),
        device_scales=not f.simulated, overhead_s=overhead, cores=cores, fit_workers=nw,
        scales=dict(scales or {}), others_runnable=f.others_runnable,
        usable=float(f.usable_cores), main_runnable=main, local_ranks=max(1, f.local_ranks),
    )


def best_workers(model: BoundModel, max_workers: int, batch_size: int | None = None) -> int:
    """The smallest num_workers within KNEE_SHARE of the best predicted throughput."""
    preds = {n: model.predict(n, batch_size)[0] for n in range(0, max_workers + 1)}
    best = max(preds.values())
    return min(n for n, p in preds.items() if p >= KNEE_SHARE * best)
