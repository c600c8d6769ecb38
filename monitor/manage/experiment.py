"""Sweeps and tunes against real workloads: each configuration is a managed run of its own
(a fresh workload process, so none inherits another's warm workers or caches), measured by
monitor/manage/measure.py and assessed by monitor/assess/window.py; the search itself is
monitor/tuning/search.py's."""
from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

from monitor.config import LoaderConfig
from monitor.manage.measure import Measurement, measure
from monitor.store import FAILED
from monitor.thresholds import memory_budget_mb
from monitor.tuning.search import ConfigResult, SweepState, autotune, run_sweep

if TYPE_CHECKING:
    from monitor.manage.measure import Lab
    from monitor.store import Store


def result_from_measurement(m: Measurement, cfg: LoaderConfig, seconds: float) -> ConfigResult:
    """A sweep row from a Measurement: the same assessment, the same figures."""
    a = m.assessment
    d = a.to_dict() if a is not None else {}

    def num(key: str) -> float | None:
        v = d.get(key)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    advised = None
    if a is not None:
        advised = next((x.value for x in a.diagnosis.advice if x.param == "num_workers"), None)
    status = "cancelled" if m.cancelled else ("failed" if m.status == FAILED else "ok")
    return ConfigResult(
        config=cfg, run_id=m.run_id, throughput=num("throughput"),
        throughput_spread=num("throughput_spread"), data_wait_share=num("data_wait_share"),
        device_busy_mean=num("device_busy_mean"), peak_memory_mb=num("peak_memory_mb"),
        status=status, reason=(m.error or "").splitlines()[0] if m.error else None,
        seconds=seconds, advised_workers=advised, verdict=d.get("verdict"),
        assessment=d or None,
    )


def step_time_of(store: Store, run_id: int) -> float | None:
    """The device step a run used, in ms (the median compute of its steps)."""
    steps = store.steps(run_id)
    return round(float(steps["compute_s"].median()) * 1000, 1) if len(steps) else None


class Experiments:
    """Binds sweeps and tunes to a Lab (the page's, so the live workload stops while
    they run; or a CLI command's own). `cancel` stops the configuration being measured."""

    def __init__(self, rt: Lab, seconds: float, parts: int = 3) -> None:
        self.rt, self.seconds, self.parts = rt, seconds, parts
        self.cancel = threading.Event()
        self.pinned_step_ms: float | None = None

    def measure(self, cfg: LoaderConfig) -> ConfigResult:
        """One configuration as its own run. A calibrated step (step_time_ms None) is pinned
        to what the first run calibrated, so every configuration meets the same device."""
        t = time.monotonic()
        run_cfg = cfg
        if cfg.step_time_ms is None and self.pinned_step_ms is not None:
            run_cfg = cfg.replace(step_time_ms=self.pinned_step_ms)
        name = f"{cfg.preset} nw={cfg.num_workers} pf={cfg.prefetch_factor} bs={cfg.batch_size}"
        m = measure(self.rt, run_cfg, self.seconds, name=name, parts=self.parts,
                    cancel=self.cancel)
        if cfg.step_time_ms is None and self.pinned_step_ms is None:
            self.pinned_step_ms = step_time_of(self.rt.store, m.run_id)
        return result_from_measurement(m, cfg, time.monotonic() - t)

    def available_mb(self) -> float | None:
        """The memory a configuration may use: the one budget resolver's, else what the
        machine has available now."""
        budget = memory_budget_mb(self.rt.memory_budget_mb)
        if budget is not None:
            return budget
        import psutil

        return psutil.virtual_memory().available / (1024 * 1024)

    def sweep(self, configs: list[LoaderConfig], state: SweepState | None = None) -> SweepState:
        if len(configs) > 1:
            self.rt.manager.warm()  # every configuration forked from one server
        return run_sweep(configs, self.measure, state or SweepState("sweep", len(configs)),
                         self.cancel, self.available_mb())

    def tune(self, base: LoaderConfig, max_workers: int, budget_s: float | None = None,
             state: SweepState | None = None) -> SweepState:
        self.rt.manager.warm()
        return autotune(base, self.measure, max_workers, budget_s, state, self.cancel,
                        memory_budget=memory_budget_mb(self.rt.memory_budget_mb))
