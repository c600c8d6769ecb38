"""What an assessment needs to know of this machine (monitor/assess/window.py Context), read
now: usable cores and cgroup CPU budget, the worker ceiling, the memory budget, and the
prediction scales its measured outcomes taught it (`learn`, their one writer). Built
without a Runtime, so `compare` and `export` open no NVML and start no process."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from monitor.assess import outcomes
from monitor.assess.window import Context
from monitor.config import max_workers
from monitor.sampling.budget import cpu_budget, usable_cores

if TYPE_CHECKING:
    from monitor.store import Store


def machine_context(memory_budget_mb: float | None = None,
                    prediction_scales: dict[str, float] | None = None) -> Context:
    """This machine's limits, read now (cgroup throttling changes); `prediction_scales`: what
    its store's measured outcomes say of the bound model's predictions, by limit."""
    return Context(cpu_budget(), max_workers(usable_cores()), memory_budget_mb,
                   dict(prediction_scales or {}))


def learn(store: Store, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Fold a run's measured outcomes into this machine's prediction scales in its store
    (monitor/assess/outcomes.py `fold`), and return the scales now in force."""
    state = outcomes.state_of(store)
    new = outcomes.fold(state, rows)
    if new != state:
        store.set_meta(outcomes.SCALE_KEY, json.dumps(new, sort_keys=True))
    return outcomes.scale_of(store)
