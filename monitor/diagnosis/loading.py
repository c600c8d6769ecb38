"""Where one loader's time per sample goes, from a window's steps and host samples: on a
CPU, runnable but waiting for one, blocked (storage, locks, sleep); and whether the loop's
wait was for batches its workers had made ahead (NOTE [the loop's receive] in
monitor/diagnosis/costs.py), which says nothing of their time. Pure: the frames and
monitor/diagnosis/features.py's CPU figures in."""
from __future__ import annotations

from typing import Any

import pandas as pd

from monitor.thresholds import AHEAD_MIN_STEPS, AHEAD_SHARE, RUNQ_MIN_STEPS, STARVING_SHARE


def receive(steps: pd.DataFrame) -> tuple[float | None, float | None,
                                          tuple[float, float] | None]:
    """(share, seconds, split): the share of the data wait spent on steps asked for with a
    finished batch already queued and none held out of order (the steps' `ready` and
    `held`, from the probe): what the loop waited for batches its workers had made ahead,
    receiving them; that wait per such step; and where the loop's thread was through it
    (receipt()). (None, None, None) where too few steps measured `ready` (no workers, not a
    multiprocessing loader, an older run). A slow sample holding the in-order queue
    (head-of-line) has its wait on held steps, a loop waiting for its workers on steps with
    nothing queued: neither is the loop's own receiving."""
    if steps.empty or "ready" not in steps.columns:
        return None, None, None
    ready = pd.to_numeric(steps["ready"], errors="coerce")
    seen = ready.notna()
    if int(seen.sum()) < AHEAD_MIN_STEPS:
        return None, None, None
    held = pd.to_numeric(steps["held"], errors="coerce").fillna(0) \
        if "held" in steps.columns else 0
    mine = seen & (ready >= 1) & (held < 1)
    wait = steps["wait_s"][seen]
    total = float(wait.sum())
    own = steps["wait_s"][mine]
    share = float(own.sum()) / total if total > 0 else 0.0
    return share, (float(own.mean()) if len(own) else None), receipt(steps[mine])


def receipt(steps: pd.DataFrame) -> tuple[float, float | None] | None:
    """(on a CPU, waiting for one): the shares of these steps' data wait the loop's thread
    spent so (the steps' `wait_cpu_s`, and `wait_runq_s` read on a sample of them: NOTE [the
    loop's receive] in monitor/diagnosis/costs.py); the rest it was blocked, waiting on the
    workers' hand-off. None where fewer than AHEAD_MIN_STEPS measured it; the wait for a CPU
    None where fewer than RUNQ_MIN_STEPS did (the kernel did not say, or too few steps)."""
    if "wait_cpu_s" not in steps.columns:
        return None
    cpu = pd.to_numeric(steps["wait_cpu_s"], errors="coerce")
    measured = cpu.notna()
    wait = float(steps["wait_s"][measured].sum())
    if int(measured.sum()) < AHEAD_MIN_STEPS or wait <= 0:
        return None
    on = min(1.0, float(cpu[measured].sum()) / wait)
    if "wait_runq_s" not in steps.columns:
        return on, None
    runq = pd.to_numeric(steps["wait_runq_s"], errors="coerce")
    sampled = runq.notna() & measured
    each = float(steps["wait_s"][sampled].sum())
    if int(sampled.sum()) < RUNQ_MIN_STEPS or each <= 0:
        return on, None
    return on, min(1.0 - on, float(runq[sampled].sum()) / each)


def held(f: Any) -> float | None:
    """The share of the wait on batches made ahead the loop's thread was blocked, neither on
    a CPU nor waiting for one: waiting on the workers' own threads to hand each batch over
    (receipt()); None where not measured."""
    on, runq = getattr(f, "receive_cpu_share", None), getattr(f, "receive_runq_share", None)
    return None if on is None or runq is None else max(0.0, 1.0 - on - runq)


def made_ahead(share: float | None) -> bool:
    """Most of the loop's data wait was on batches its workers had made ahead (receive()'s
    share at least AHEAD_SHARE): the loop's own receiving, not the workers, was waited for."""
    return share is not None and share >= AHEAD_SHARE


def loading(steps: pd.DataFrame, nw: int, cpu: dict, span_s: float, share: float,
            ahead: float | None = None) -> tuple[float | None, float | None]:
    """(CPU seconds, wall seconds) of loading one sample by one loader process. The wall
    time of workers is known only where they were saturated: the loop waited for them
    (its data-wait share at least STARVING_SHARE), not for batches they had made ahead
    (`ahead`: receive()'s share), when each made 1/nw of the samples over the window."""
    samples = float(steps["samples"].sum()) if not steps.empty else 0.0
    if samples <= 0:
        return None, None
    cpu_s = wall_s = None
    if nw == 0:
        if cpu["main"] is not None:  # the simulated accelerator sleeps: main CPU is loading
            cpu_s = cpu["main"] * span_s / samples
        wall_s = float(steps["wait_s"].sum()) / samples
    else:
        if cpu["workers"] is not None:
            cpu_s = cpu["workers"] * span_s / samples
        if share >= STARVING_SHARE and not made_ahead(ahead):
            wall_s = nw * span_s / samples
    if cpu_s is not None and wall_s is not None:
        cpu_s = min(cpu_s, wall_s)
    return cpu_s, wall_s


def split(steps: pd.DataFrame, nw: int, cpu: dict, span_s: float, cpu_s: float | None,
          wall_s: float | None, sampled: bool = True) -> dict[str, Any]:
    """Where one loader's time per sample goes, measured (DESIGN.md: CPU wait, blocked):
    on a CPU (cpu_s), runnable but waiting for one (the run queue, from schedstat), and
    blocked, the rest (storage, locks, sleep). Storage is never inferred from wall - CPU:
    without schedstat the split is missing and says so; reads per sample (/proc io) are the
    storage evidence. `sampled`: the host sampler has rows in the window (a run shorter
    than its pass, a rank it could not read, has none: that is what is missing then, not
    the kernel's figures)."""
    out: dict[str, Any] = {"runq": None, "blocked": None, "read_kb": None, "missing": ()}
    samples = float(steps["samples"].sum()) if not steps.empty else 0.0
    runq = cpu["main_runq"] if nw == 0 else cpu["workers_runq"]
    read = cpu["main_read"] if nw == 0 else cpu["workers_read"]
    missing = []
    if not sampled and (runq is None or read is None):
        missing.append("CPU wait and reads (no host sample of the loaders in this window)")
    else:
        if runq is None:
            missing.append("CPU wait (no /proc schedstat here)")
        if read is None:
            missing.append("reads (no /proc io here)")
    out["missing"] = tuple(missing)
    if samples <= 0:
        return out
    if read is not None:
        out["read_kb"] = read * span_s / samples
    if runq is not None and wall_s is not None and cpu_s is not None:
        out["runq"] = min(runq * span_s / samples, max(0.0, wall_s - cpu_s))
        out["blocked"] = max(0.0, wall_s - cpu_s - out["runq"])
    return out
