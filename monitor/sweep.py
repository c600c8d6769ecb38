"""Sweep and autotune: the stepwise test users do by hand, automated and honestly measured.

A sweep runs each configuration of a grid as its own run (a fresh workload process, so no
configuration inherits another's warm workers or caches), discards the warm-up, cuts the
steady state into windows and reports the median and spread of throughput, the data-wait
share, device busy and the peak RSS of the process tree. Configurations predicted not to fit
in memory (from the per-worker memory measured so far) are skipped with the reason.

The knee is the cheapest configuration within KNEE_TOLERANCE of the best, "cheapest" meaning
fewer worker processes, then fewer prefetched batches, then smaller batches.

Autotune is an adaptive search seeded by the bound model: measure the starting point, jump to
the bound model's predicted knee, then take single steps of num_workers (and one of
prefetch_factor) until no neighbour gains more than PLATEAU; no step up where the diagnosis
found the cores saturated; it stops early on the time budget. It usually needs three or
four configurations where a grid needs ten or more.
"""
from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from monitor.config import LoaderConfig

KNEE_TOLERANCE = 0.03  # "within 3% of the best"
PLATEAU = 0.03  # a step that gains less than this ends the search
MEMORY_HEADROOM = 0.85  # skip a configuration predicted to use more of the memory than this
CORES_BOUND = ("cpu-bound", "oversubscribed")  # verdicts where loader changes cannot help
SWEEP_PARAMS = ("num_workers", "prefetch_factor", "batch_size", "pin_memory",
                "persistent_workers")


@dataclass(frozen=True, slots=True)
class ConfigResult:
    """One configuration's measurement (or why it was skipped)."""

    config: LoaderConfig
    run_id: int | None = None
    throughput: float | None = None  # median over windows, samples/s
    throughput_spread: float | None = None  # (max - min) / median over windows
    data_wait_share: float | None = None
    device_busy_mean: float | None = None
    peak_rss_mb: float | None = None
    status: str = "ok"  # ok | skipped | failed | cancelled
    reason: str | None = None
    seconds: float = 0.0
    advised_workers: int | None = None  # the diagnosis's num_workers advice, if any
    verdict: str | None = None  # the diagnosis's verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": {k: getattr(self.config, k) for k in SWEEP_PARAMS},
            "run_id": self.run_id, "throughput": self.throughput,
            "throughput_spread": self.throughput_spread,
            "data_wait_share": self.data_wait_share,
            "device_busy_mean": self.device_busy_mean, "peak_rss_mb": self.peak_rss_mb,
            "status": self.status, "reason": self.reason, "seconds": self.seconds,
        }


def parse_param(text: str) -> tuple[str, list[Any]]:
    """'num_workers=0,1,2' -> ('num_workers', [0, 1, 2]); booleans as on/off/true/false."""
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not values.strip():
        raise ValueError(f"--param {text!r}: write NAME=V1,V2,... e.g. num_workers=0,1,2,4")
    if name not in SWEEP_PARAMS:
        raise ValueError(f"--param {name!r}: sweepable are {', '.join(SWEEP_PARAMS)}")
    out: list[Any] = []
    for v in values.split(","):
        v = v.strip().lower()
        if name in ("pin_memory", "persistent_workers"):
            if v not in ("0", "1", "on", "off", "true", "false"):
                raise ValueError(f"--param {name}: use on/off, not {v!r}")
            out.append(v in ("1", "on", "true"))
        else:
            try:
                out.append(int(v))
            except ValueError:
                raise ValueError(f"--param {name}: {v!r} is not a whole number") from None
    return name, list(dict.fromkeys(out))


def grid(base: LoaderConfig, params: dict[str, list[Any]]) -> list[LoaderConfig]:
    """Every combination, validated; settings that do not apply (prefetch_factor or
    persistent_workers with num_workers=0) collapse into one configuration."""
    names = list(params)
    seen: dict[LoaderConfig, None] = {}
    for combo in itertools.product(*(params[n] for n in names)):
        values = dict(zip(names, combo, strict=True))
        if values.get("num_workers", base.num_workers) == 0:
            values.pop("prefetch_factor", None)
            values.pop("persistent_workers", None)
        seen.setdefault(base.replace(**values), None)
    return list(seen)


def cost_key(cfg: LoaderConfig) -> tuple:
    """Cheaper first: fewer processes, fewer batches in flight, smaller batches, no pinning."""
    return (cfg.num_workers, (cfg.prefetch_factor or 0) * max(cfg.num_workers, 1),
            cfg.batch_size, cfg.pin_memory, cfg.persistent_workers)


@dataclass(frozen=True, slots=True)
class Knee:
    best: ConfigResult
    knee: ConfigResult
    text: str


def find_knee(results: Iterable[ConfigResult], tol: float = KNEE_TOLERANCE) -> Knee | None:
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
        if best.peak_rss_mb and knee.peak_rss_mb:
            more.append(f"{best.peak_rss_mb - knee.peak_rss_mb:+,.0f} MB")
        text += (f"; {_short(best.config, knee.config)} adds "
                 f"{(best.throughput / knee.throughput - 1):.0%}"
                 + (f" for {' and '.join(more)}" if more else ""))
    return Knee(best, knee, text)


def describe(cfg: LoaderConfig) -> str:
    """'num_workers=2, prefetch_factor=4, batch_size=32' (plus pin/persistent when on)."""
    parts = [f"num_workers={cfg.num_workers}"]
    if cfg.num_workers:
        parts.append(f"prefetch_factor={cfg.prefetch_factor}")
    parts.append(f"batch_size={cfg.batch_size}")
    parts += [k for k in ("pin_memory", "persistent_workers") if getattr(cfg, k)]
    return ", ".join(parts)


def _short(cfg: LoaderConfig, other: LoaderConfig) -> str:
    """The settings where `cfg` differs from `other` ('num_workers=3'), or num_workers."""
    diff = [f"{k}={getattr(cfg, k)}" for k in SWEEP_PARAMS if getattr(cfg, k) != getattr(other, k)]
    return ", ".join(diff) if diff else f"num_workers={cfg.num_workers}"


MeasureFn = Callable[[LoaderConfig], ConfigResult]


def memory_fits(cfg: LoaderConfig, seen: list[ConfigResult], available_mb: float | None,
                ) -> str | None:
    """Why `cfg` would not fit (None when it fits or nothing is known yet): the peak RSS
    measured so far, extrapolated linearly in worker processes."""
    ok = [r for r in seen if r.status == "ok" and r.peak_rss_mb]
    if available_mb is None or not ok:
        return None
    with_workers = [r for r in ok if r.config.num_workers > 0]
    base = min(ok, key=lambda r: r.config.num_workers)
    per_worker = 0.0
    if with_workers:
        w = max(with_workers, key=lambda r: r.config.num_workers)
        if w.config.num_workers > base.config.num_workers:
            per_worker = max(0.0, (w.peak_rss_mb - base.peak_rss_mb)
                             / (w.config.num_workers - base.config.num_workers))
    predicted = base.peak_rss_mb + per_worker * (cfg.num_workers - base.config.num_workers)
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


def autotune(
    base: LoaderConfig, measure_fn: MeasureFn, predict: Callable[[ConfigResult], int | None],
    max_workers: int, budget_s: float | None = None, state: SweepState | None = None,
    cancel: threading.Event | None = None, clock: Callable[[], float] = time.monotonic,
) -> SweepState:
    """Seeded local search over num_workers (then one prefetch_factor step).

    `predict(result)` returns the bound model's advised num_workers for a measured start (or
    None). Each configuration is measured once; the best measured one wins.
    """
    state = state or SweepState("tune", 0)
    t0 = clock()
    tried: dict[LoaderConfig, ConfigResult] = {}

    def out_of_time() -> bool:
        return (cancel is not None and cancel.is_set()) or (
            budget_s is not None and clock() - t0 >= budget_s)

    def run(cfg: LoaderConfig) -> ConfigResult | None:
        if cfg in tried:
            return tried[cfg]
        if out_of_time():
            return None
        state.current = cfg
        r = measure_fn(cfg)
        tried[cfg] = r
        state.add(r)
        state.total = len(tried)
        return r

    def score(r: ConfigResult | None) -> float:
        return r.throughput if r is not None and r.status == "ok" and r.throughput else -1.0

    def cores_bound(r: ConfigResult) -> bool:
        # the diagnosis saw the cores saturated: more workers or prefetch cannot help
        return r.verdict in CORES_BOUND

    try:
        best = run(base)
        seed = predict(best) if best is not None and best.status == "ok" else None
        if seed is not None and seed != base.num_workers:
            r = run(base.replace(num_workers=seed))
            if score(r) > score(best):
                best = r
        improved = True
        while improved and best is not None and not out_of_time():
            improved = False
            n = best.config.num_workers
            for m in (n + 1, n - 1):
                if not 0 <= m <= max_workers or (m > n and cores_bound(best)):
                    continue
                cand = best.config.replace(num_workers=m)
                if cand in tried:
                    continue
                r = run(cand)
                if score(r) > (1 + PLATEAU) * score(best):
                    best, improved = r, True
                    break
                if m == n + 1 and score(r) >= 0:
                    break  # going up did not pay: the plateau starts here
        if best is not None and best.config.num_workers > 0 and (best.data_wait_share or 0) \
                > 0.05 and not cores_bound(best) and not out_of_time():
            pf = best.config.prefetch_factor or 2
            r = run(best.config.replace(prefetch_factor=pf * 2))
            if score(r) > (1 + PLATEAU) * score(best):
                best = r
        if best is not None and best.status == "ok":
            state.best = {"config": best.config.to_dict(), "throughput": best.throughput,
                          "run_id": best.run_id}
    except Exception as exc:
        state.error = f"{type(exc).__name__}: {exc}"
    finally:
        state.finish()
    return state


def result_from_measurement(m: Any, cfg: LoaderConfig, seconds: float) -> ConfigResult:
    """A ConfigResult from measure.Measurement."""
    s = m.summary
    advised = None
    if m.diagnosis is not None:
        advised = next((a.value for a in m.diagnosis.advice if a.param == "num_workers"), None)
    status = "cancelled" if m.cancelled else ("failed" if m.status == "failed" else "ok")
    thr = m.median_throughput
    return ConfigResult(
        config=cfg, run_id=m.run_id,
        throughput=None if thr is None or math.isnan(thr) else thr,
        throughput_spread=m.throughput_spread,
        data_wait_share=None if math.isnan(s.data_wait_share) else s.data_wait_share,
        device_busy_mean=None if math.isnan(s.device_busy_mean) else s.device_busy_mean,
        peak_rss_mb=m.peak_rss_mb, status=status,
        reason=(m.error or "").splitlines()[0] if m.error else None, seconds=seconds,
        advised_workers=advised, verdict=m.diagnosis.verdict if m.diagnosis else None,
    )


def step_time_of(store: Any, run_id: int) -> float | None:
    """The device step a run used, in ms (the median compute of its steps)."""
    steps = store.steps(run_id)
    return round(float(steps["compute_s"].median()) * 1000, 1) if len(steps) else None


class Runner:
    """Binds sweeps and tunes to a store, a collector and a session manager (the page's, so
    the live workload stops while they run; or a CLI's own)."""

    def __init__(self, store: Any, collector: Any, manager: Any, seconds: float,
                 windows: int = 3, memory_budget_mb: float | None = None) -> None:
        self.store, self.collector, self.manager = store, collector, manager
        self.seconds, self.windows = seconds, windows
        self.memory_budget_mb = memory_budget_mb
        self.cancel = threading.Event()
        self.pinned_step_ms: float | None = None

    def measure(self, cfg: LoaderConfig) -> ConfigResult:
        """One configuration as its own run. A calibrated step (step_time_ms None) is pinned
        to what the first run calibrated, so every configuration meets the same device."""
        from monitor.measure import measure

        t = time.monotonic()
        run_cfg = cfg
        if cfg.step_time_ms is None and self.pinned_step_ms is not None:
            run_cfg = cfg.replace(step_time_ms=self.pinned_step_ms)
        m = measure(self.store, run_cfg, self.seconds, self.collector, manager=self.manager,
                    windows=self.windows, cancel=self.cancel,
                    name=f"{cfg.preset} nw={cfg.num_workers} pf={cfg.prefetch_factor} "
                         f"bs={cfg.batch_size}", memory_budget_mb=self.memory_budget_mb)
        if cfg.step_time_ms is None and self.pinned_step_ms is None:
            self.pinned_step_ms = step_time_of(self.store, m.run_id)
        return result_from_measurement(m, cfg, time.monotonic() - t)

    def available_mb(self) -> float | None:
        if self.memory_budget_mb is not None:
            return self.memory_budget_mb
        import psutil

        return psutil.virtual_memory().available / (1024 * 1024)

    def sweep(self, configs: list[LoaderConfig], state: SweepState | None = None) -> SweepState:
        return run_sweep(configs, self.measure, state or SweepState("sweep", len(configs)),
                         self.cancel, self.available_mb())

    def tune(self, base: LoaderConfig, max_workers: int, budget_s: float | None = None,
             state: SweepState | None = None) -> SweepState:
        return autotune(base, self.measure, lambda r: r.advised_workers, max_workers,
                        budget_s, state, self.cancel)
