"""The pure search behind sweep and tune: grids, the knee, memory skips, and the seeded hill
climb. No store, no processes: a search is given a `measure_fn(config) -> ConfigResult`
(monitor/manage/experiment.py runs real workloads; tests pass synthetic surfaces).

A sweep measures each configuration of a grid in turn, skipping those predicted not to fit
in memory (from the per-worker memory measured so far). The knee is the cheapest
configuration within KNEE_SHARE of the best, "cheapest" meaning fewer worker processes, then
fewer prefetched batches, then smaller batches.

Autotune is the one policy of policy.py (shared with the live autotuner) driven over fresh
runs: the starting point, the bound model's knee, single steps up while the data wait stays
high and the cores are not the limit, a deeper prefetch; each kept only if it beats the best
by more than the noise. It usually needs three to five runs where a grid needs twenty.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from monitor.config import LIVE_SETTINGS, LOADER_SETTINGS, SETTINGS, LoaderConfig, settings_label
from monitor.thresholds import KNEE_SHARE, MEMORY_HEADROOM, std_error
from monitor.tuning.policy import Observation, Policy, loader_advice, memory_left_mb

SWEEP_PARAMS = LOADER_SETTINGS


@dataclass(frozen=True, slots=True)
class ConfigResult:
    """One configuration's measurement (or why it was skipped). The figures are those of
    the run's steady-state assessment (monitor/assess/window.py), kept whole in `assessment`."""

    config: LoaderConfig
    run_id: int | None = None
    throughput: float | None = None  # samples/s over the steady-state window
    throughput_spread: float | None = None  # (max - min) / median over its parts
    data_wait_share: float | None = None
    device_busy_mean: float | None = None
    peak_memory_mb: float | None = None  # main RSS + workers' USS, the window's peak
    status: str = "ok"  # ok | skipped | failed | cancelled
    reason: str | None = None
    seconds: float = 0.0  # wall time this configuration took, start-up included
    advised_workers: int | None = None  # the diagnosis's num_workers advice, if any
    verdict: str | None = None
    assessment: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A sweep --json row: the assessment's keys (as measure --json), plus the config,
        run, status and time."""
        out = {k: None for k in ("throughput", "throughput_spread", "data_wait_share",
                                 "device_busy_mean", "peak_memory_mb", "verdict")}
        out.update(self.assessment or {})
        out.update(config={k: getattr(self.config, k) for k in SWEEP_PARAMS},
                   run_id=self.run_id, status=self.status, reason=self.reason,
                   seconds=self.seconds)
        return out


def grid(base: LoaderConfig, params: dict[str, list[Any]]) -> list[LoaderConfig]:
    """Every combination, validated; settings that do not apply (prefetch_factor or
    persistent_workers with num_workers=0) collapse into one configuration."""
    names = list(params)
    seen: dict[LoaderConfig, None] = {}
    for combo in itertools.product(*(params[n] for n in names)):
        values = dict(zip(names, combo, strict=True))
        if values.get("num_workers", base.num_workers) == 0:
            for setting in SETTINGS:
                if setting.worker_only:
                    values.pop(setting.name, None)
        seen.setdefault(base.replace(**values), None)
    return list(seen)


def cost_key(cfg: LoaderConfig) -> tuple:
    """Cheaper first: fewer processes, fewer batches in flight, smaller batches, then each
    switch at its default before moved (no pinning, no kept workers, batches in order)."""
    return (cfg.num_workers, (cfg.prefetch_factor or 0) * max(cfg.num_workers, 1),
            cfg.batch_size, *(getattr(cfg, s.name) != s.default for s in SETTINGS
                              if s.kind is bool))


@dataclass(frozen=True, slots=True)
class Knee:
    best: ConfigResult
    knee: ConfigResult
    text: str


def find_knee(results: Iterable[ConfigResult], tol: float = 1 - KNEE_SHARE,
              ) -> Knee | None:
    ok = [r for r in results if r.status == "ok" and r.throughput]
    if not ok:
        return None
    best = max(ok, key=lambda r: r.throughput)
    near = [r for r in ok if r.throughput >= (1 - tol) * best.throughput]
    knee = min(near, key=lambda r: cost_key(r.config))
    share = knee.throughput / best.throughput
    if knee is best:
        return Knee(best, knee, f"best: {describe(best.config)} at {best.throughput:,.0f} "
                                f"samples/s; nothing cheaper comes within {tol:.0%}")
    text = (f"{describe(knee.config)} reaches {share:.0%} of the best "
            f"({knee.throughput:,.0f} of {best.throughput:,.0f} samples/s)")
    if knee is not best:
        more = []
        dn = best.config.num_workers - knee.config.num_workers
        if dn:
            more.append(f"{dn:+d} process{'es' if abs(dn) != 1 else ''}")
        if best.peak_memory_mb and knee.peak_memory_mb:
            more.append(f"{best.peak_memory_mb - knee.peak_memory_mb:+,.0f} MB")
        text += (f"; {_short(best.config, knee.config)} adds "
                 f"{(best.throughput / knee.throughput - 1):.0%}"
                 + (f" for {' and '.join(more)}" if more else ""))
    return Knee(best, knee, text)


def describe(cfg: LoaderConfig) -> str:
    """A configuration's label (config.settings_label)."""
    return settings_label(cfg)


def _short(cfg: LoaderConfig, other: LoaderConfig) -> str:
    """The settings where `cfg` differs from `other` ('num_workers=3'), or num_workers."""
    diff = [f"{k}={getattr(cfg, k)}" for k in SWEEP_PARAMS if getattr(cfg, k) != getattr(other, k)]
    return ", ".join(diff) if diff else f"num_workers={cfg.num_workers}"


MeasureFn = Callable[[LoaderConfig], ConfigResult]


def memory_fits(cfg: LoaderConfig, seen: list[ConfigResult], available_mb: float | None,
                ) -> str | None:
    """Why `cfg` would not fit (None when it fits or nothing is known yet): the peak RSS
    measured so far, extrapolated linearly in worker processes."""
    ok = [r for r in seen if r.status == "ok" and r.peak_memory_mb]
    if available_mb is None or not ok:
        return None
    with_workers = [r for r in ok if r.config.num_workers > 0]
    base = min(ok, key=lambda r: r.config.num_workers)
    per_worker = 0.0
    if with_workers:
        w = max(with_workers, key=lambda r: r.config.num_workers)
        if w.config.num_workers > base.config.num_workers:
            per_worker = max(0.0, (w.peak_memory_mb - base.peak_memory_mb)
                             / (w.config.num_workers - base.config.num_workers))
    predicted = base.peak_memory_mb + per_worker * (cfg.num_workers - base.config.num_workers)
    if predicted > MEMORY_HEADROOM * available_mb:
        return (f"predicted {predicted:,.0f} MB ({per_worker:,.0f} MB per worker measured) "
                f"exceeds {MEMORY_HEADROOM:.0%} of {available_mb:,.0f} MB available")
    return None


@dataclass
class SweepState:
    """Progress of a sweep or tune, readable from another thread (the page)."""

    kind: str  # sweep | tune
    total: int
    results: list[ConfigResult] = field(default_factory=list)
    current: LoaderConfig | None = None
    done: bool = False
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    best: dict[str, Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, r: ConfigResult) -> None:
        with self.lock:
            self.results.append(r)

    def snapshot(self) -> tuple[list[ConfigResult], LoaderConfig | None, bool]:
        with self.lock:
            return list(self.results), self.current, self.done

    def finish(self) -> None:
        self.current = None
        self.finished = time.monotonic()
        self.done = True

    @property
    def seconds(self) -> float:
        return (self.finished or time.monotonic()) - self.started


def run_sweep(
    configs: list[LoaderConfig], measure_fn: MeasureFn, state: SweepState | None = None,
    cancel: threading.Event | None = None, available_mb: float | None = None,
) -> SweepState:
    """Measure each configuration in turn (skipping those that will not fit)."""
    state = state or SweepState("sweep", len(configs))
    try:
        for cfg in configs:
            if cancel is not None and cancel.is_set():
                break
            why = memory_fits(cfg, state.results, available_mb)
            if why is not None:
                state.add(ConfigResult(cfg, status="skipped", reason=why))
                continue
            state.current = cfg
            r = measure_fn(cfg)
            state.add(r)
            if r.status == "cancelled":
                break
    except Exception as exc:  # reported on the page / CLI, never a dead thread
        state.error = f"{type(exc).__name__}: {exc}"
    finally:
        state.finish()
    return state


def observation(r: ConfigResult, memory_budget: float | None = None) -> Observation:
    """The policy's view of a fresh run: its steady-window throughput, the standard error of
    that window's parts, and what its diagnosis advised; a failed run is a failed move."""
    a = r.assessment or {}
    ev = a.get("evidence") or {}
    parts = [float(x) for x in a.get("throughput_windows") or [] if x]
    se = std_error(parts)
    knee = next((x for x in a.get("advice") or [] if x.get("param") == "num_workers"), None)
    settings = {k: getattr(r.config, k) for k in LIVE_SETTINGS}
    failed = None if r.status == "ok" and r.throughput else (r.reason or r.status)
    return Observation(
        settings, r.throughput or 0.0, se, r.verdict or "", r.data_wait_share or 0.0,
        knee["value"] if knee else r.advised_workers,
        knee.get("predicted_throughput") if knee else None,
        ev.get("worker_uss_mb") or ev.get("worker_rss_mb"),
        memory_left_mb(ev.get("mem_available_mb"), r.peak_memory_mb, memory_budget),
        failed, a.get("accelerator_kind") == "cuda", ev.get("usable_cores"),
        ev.get("other_cpu_cores"), None, loader_advice(a.get("advice")))


def autotune(
    base: LoaderConfig, measure_fn: MeasureFn, max_workers: int,
    budget_s: float | None = None, state: SweepState | None = None,
    cancel: threading.Event | None = None, clock: Callable[[], float] = time.monotonic,
    memory_budget: float | None = None,
) -> SweepState:
    """`monitor tune`: the one policy (policy.py) over fresh runs. Each setting it asks for is
    measured once, as a run of its own; a revert needs no run (the best is measured). Stops
    when the policy settles, on the time budget, or on cancel."""
    state = state or SweepState("tune", 0)
    policy = Policy(max_workers, unit="run")
    t0 = clock()
    seen: dict[tuple, tuple[ConfigResult, Observation]] = {}

    def run(cfg: LoaderConfig) -> Observation:
        state.current = cfg
        r = measure_fn(cfg)
        state.add(r)
        state.total = len(state.results)
        obs = observation(r, memory_budget)
        seen[_settings_key(cfg)] = (r, obs)
        return obs

    def out_of_time() -> bool:
        return (cancel is not None and cancel.is_set()) or (
            budget_s is not None and clock() - t0 >= budget_s)

    try:
        move = policy.observe(run(base))
        while move is not None and not out_of_time():
            cfg = base.replace(**move.settings)
            known = seen.get(_settings_key(cfg)) if not (move.extend or move.remeasure) \
                else None
            move = policy.observe(known[1], measured=False) if known else \
                policy.observe(run(cfg))
            if state.results and state.results[-1].status == "cancelled":
                break
        best = seen.get(_settings_key(base.replace(**policy.best.settings))) \
            if policy.best else None
        if best is not None and best[0].status == "ok" and best[0].throughput:
            state.best = {"config": best[0].config.to_dict(), "throughput": best[0].throughput,
                          "run_id": best[0].run_id, "settled": policy.settled,
                          "moves": policy.moves, "extensions": policy.extensions,
                          "rematches": policy.rematches}
    except Exception as exc:
        state.error = f"{type(exc).__name__}: {exc}"
    finally:
        state.finish()
    return state


def _settings_key(cfg: LoaderConfig) -> tuple:
    return tuple(getattr(cfg, k) for k in LIVE_SETTINGS)
