"""What an assessment needs to know of this machine (monitor/assess/window.py Context), read
now: usable cores and cgroup CPU budget, the worker ceiling, the memory budget. Built
without a Runtime, so `compare` and `export` open no NVML and start no process."""
from __future__ import annotations

from monitor.assess.window import Context
from monitor.config import max_workers
from monitor.sampling.host import cpu_budget, usable_cores


def machine_context(memory_budget_mb: float | None = None,
                    prediction_scales: dict[str, float] | None = None) -> Context:
    """This machine's limits, read now (cgroup throttling changes); `prediction_scales`: what
    its store's measured outcomes say of the bound model's predictions, by limit."""
    return Context(cpu_budget(), max_workers(usable_cores()), memory_budget_mb,
                   dict(prediction_scales or {}))
