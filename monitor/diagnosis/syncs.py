"""Host syncs on CUDA: the GPU idle inside the steps while the loop hardly waits for data,
with the host stopping at synchronizing calls in every step (`.item()`, `.cpu()`, an `if`
on a tensor): at each the device empties its queue and idles until the host queues more.
The syncs are counted by the probe on a sample of steps (NOTE [counting syncs] in
monitor/probe/syncs.py: the `syncs` of the loader report), the GPU's busy time is NVML's
utilisation over the window. Pure."""
from __future__ import annotations

import math
from typing import Any

from monitor.diagnosis.finding import Advice, Finding
from monitor.thresholds import STARVING_SHARE, SYNC_BUSY_MAX_PCT, SYNCS_MIN_PER_STEP

HOST_SYNCS = "host-syncs"


def host_syncs(report: dict[str, Any] | None, f: Any, gpu_util: float | None,
               throughput: float) -> Finding | None:
    """The last count of the probe's (its rank's), against NVML's utilisation (0..100) over
    the window: named when the device is busy less than SYNC_BUSY_MAX_PCT, the loop waits
    for data less than the starving line, and each step syncs SYNCS_MIN_PER_STEP or more."""
    looks = (report or {}).get("syncs") or []
    if not looks or gpu_util is None or math.isnan(gpu_util):
        return None
    last = looks[-1]
    per = float(last.get("per_step") or 0.0)
    wait = getattr(f, "starved_share", math.nan)
    if per < SYNCS_MIN_PER_STEP or not wait < STARVING_SHARE or gpu_util >= SYNC_BUSY_MAX_PCT:
        return None
    steps = max(1, int(last.get("steps") or 1))
    sites = sorted((last.get("sites") or {}).items(), key=lambda kv: -kv[1])
    where = ", ".join(f"{site}: {n / steps:.1f} a step" for site, n in sites[:3])
    busy = gpu_util / 100.0
    text = (f"The GPU is busy {gpu_util:.0f}% of the time (NVML) while the loop waits for "
            f"data only {wait:.0%} of it: the host stops at {per:.1f} CUDA syncs a step"
            + (f" ({where})" if where else "") + ", and at each the device empties its "
            "queue and idles until the host queues more. More workers cannot help.")
    # up to: the device busy for the whole of each step but its data wait
    pred = throughput * (1.0 - wait) / busy if throughput > 0 and busy > 0 else None
    first = sites[0][0] if sites else "the step"
    advice = Advice("script", "no sync in the step", pred,
                    f"take .item(), .cpu() and tensor-valued ifs out of the step ({first}): "
                    "log a metric every N steps, keep running sums on the device; copy "
                    "batches with pin_memory=True and .to(device, non_blocking=True)")
    return Finding(HOST_SYNCS, text, {"syncs_per_step": per, "steps_counted": steps,
                                      "sites": dict(sites), "gpu_util_pct": gpu_util},
                   (advice,), no_more_workers=True, leads=True)
