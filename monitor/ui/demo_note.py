"""What the demo page says when the box cannot show what the starving demo describes."""
from __future__ import annotations

from typing import Any

DEMO_LOADING_CORES = 1.25  # the starving demo's loading per step: two workers need this much


def demo_note(f: Any) -> str | None:
    """For the starving demo while other jobs take the machine's cores: why it may not show
    what its description says (starving at 0 workers, fed at 2), in the figures measured.
    The demo is calibrated for the whole box; the page says so rather than show a fed or
    starved run as the preset's nature (a busy box once read 2 workers 0.72x of 0)."""
    cfg = f.config or {}
    if cfg.get("preset") != "starving" or cfg.get("workload"):
        return None
    other = f.other_cpu_cores or 0.0
    if other < 0.5:
        return None
    free = max(0.0, f.usable_cores - other)
    fed = ("two workers may still starve it" if free < DEMO_LOADING_CORES + 0.25 else
           "two workers should still feed it")
    return (f"Other jobs on this machine take {other:.1f} of its {f.usable_cores} cores. The "
            f"demo is calibrated for the whole box (two workers feed it with "
            f"{DEMO_LOADING_CORES:g} cores of loading a step); with {free:.1f} cores left, "
            f"{fed}: the charts show this box as it is now.")
