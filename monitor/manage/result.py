"""What `measure --json` and `run --json` print, built in one place: the run's id and status,
its assessment (verdict, findings, advice, figures), NVML's utilization over the assessed
window, the accelerator, the error and the loader settings. `run --json` adds what only an
attached script has (its epochs, the probe's notes, the autotuner's moves, outcomes)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from monitor.assess.devices import run_gpu_samples
from monitor.frames import analysis

if TYPE_CHECKING:
    from monitor.assess.window import Assessment
    from monitor.store import Store

GpuFigures = tuple[int | None, float | None, float | None]  # (NVML index, util mean, its CV)


def gpu_figures(store: Store, run: dict[str, Any], a: Assessment | None) -> GpuFigures:
    """The GPU the run used and NVML's utilization over its assessed window (0..100): all
    None without NVML or without assessed steps."""
    got = run_gpu_samples(store, run, a.start, a.end) \
        if a is not None and a.features.steps else None
    if got is None:
        return None, None, None
    dev, util = got
    mean, cv = analysis.series_stats(util["util_pct"])
    return dev, mean, cv


def result(run_id: int, status: str | None, a: Assessment | None, gpu: GpuFigures,
           error: str | None, accelerator: str | None, config: dict[str, Any]
           ) -> dict[str, Any]:
    """The keys both commands print, in one order."""
    d: dict[str, Any] = {"run_id": run_id, "status": status}
    d.update(a.to_dict() if a is not None else {})
    n = int(d.get("steps") or 0)
    if status == "failed" and error and (not n or d.get("verdict_family") == "no data"):
        d["verdict_text"] = (f"The run failed after {n} step(s), too few to judge: " if n else
                             "The run failed before its first batch: ") + \
            error.strip().splitlines()[0]  # (not the live view's "judging after ... steps")
    d.update({"gpu": gpu[0], "gpu_util_mean": gpu[1], "gpu_util_cv": gpu[2], "error": error,
              "accelerator": accelerator, "config": config})
    return d
