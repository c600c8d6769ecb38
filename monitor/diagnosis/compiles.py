"""torch.compile recompiling on changing shapes: steps that stalled in their compute while
dynamo compiled new graphs for shapes it had not seen, or for a new mode (NOTE [a recompile
for a new mode]). monitor/probe/compiles.py reads its graph counter and guard failures at
each epoch's start and at exit: the `compiles` of the loader report. The device idles
through each; more workers cannot help. Named with the steps, the time they took, the
shapes that changed, and the fix in the script's terms: one shape (pad to fixed lengths,
drop_last=True) or one graph for all (mark the dimension dynamic); a mode's, paid once, has
none. Pure: the window's steps and the loader report in."""
from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from monitor.diagnosis.finding import Advice, Finding
from monitor.thresholds import COMPILE_STALL_MIN_S, COMPILE_STALL_X

RECOMPILES = "recompiles"
MISMATCH = re.compile(r"size mismatch at index (\d+)\. expected (\d+), actual (\d+)")
SHOWN_STEPS = 6
# NOTE [a recompile for a new mode]
# Dynamo guards a graph on the global state and on each module's `training` flag too: an
# evaluation inside the training loop (model.eval(), torch.no_grad()) fails them once and
# compiles a graph for that mode, which is kept beside the training one. A compiled model
# evaluated on a held-out batch every 8 steps stalled 1.0 s at its first evaluation (48%
# of a short run), and the finding said "1 recompile on new shapes" and advised padding
# batches: no shape had changed. Its guard failures say which: "GLOBAL_STATE changed:
# grad_mode" and "fn._modules['1'].training == True" (torch 2.13). Recompiles that fail
# only such guards are named as a mode's, paid once each, with no shape advice.
MODE = re.compile(r"GLOBAL_STATE changed: (\w+)|\.training == (?:True|False)")
MODES = {"grad_mode": "gradients on or off (torch.no_grad, inference_mode)",
         "training": "the model's mode (model.eval(), model.train())"}


def shape_changes(reasons: list[str]) -> list[tuple[int, int, int]]:
    """(dimension, expected, actual) of each size guard that failed, first seen first."""
    out: list[tuple[int, int, int]] = []
    for r in reasons:
        m = MISMATCH.search(r)
        if m is not None and (key := (int(m[1]), int(m[2]), int(m[3]))) not in out:
            out.append(key)
    return out


def mode_changes(reasons: list[str]) -> list[str] | None:
    """The modes whose change failed the guards ("grad_mode", "training", ...), first seen
    first; None where a reason is not a mode's (NOTE [a recompile for a new mode])."""
    out: list[str] = []
    for r in reasons:
        m = MODE.search(r)
        if m is None:
            return None
        if (key := m[1] or "training") not in out:
            out.append(key)
    return out or None


def described(changes: list[tuple[int, int, int]]) -> str:
    """The shapes that changed, per dimension: "dimension 1 took 8 sizes, 39 to 46; the
    batch dimension: a short batch (4 of 8)"."""
    out = []
    for d in sorted({c[0] for c in changes}):
        sizes = sorted({x for dd, a, b in changes if dd == d for x in (a, b)})
        short = [(a, b) for dd, a, b in changes if dd == 0 == d and b < a]
        name = "the batch dimension" if d == 0 else f"dimension {d}"
        if short:
            out.append(f"{name}: a short batch ({min(b for _, b in short)} of "
                       f"{max(a for a, _ in short)})")
        else:
            out.append(f"{name} took {len(sizes)} sizes, {sizes[0]} to {sizes[-1]}")
    return "; ".join(out)


def recompiles(steps: pd.DataFrame, report: dict[str, Any] | None,
               throughput: float) -> Finding | None:
    """The window's steps that stalled while dynamo compiled again: the looks that found new
    graphs with guard failures, from the first step of the window on."""
    looks = [e for e in (report or {}).get("compiles") or ()
             if int(e.get("recompiles") or 0) > 0 or e.get("limit_hit")]
    if not looks or steps.empty or "compute_s" not in steps.columns:
        return None
    first, last = int(steps["step"].min()), int(steps["step"].max())
    # each look covers the steps since the one before it
    mine, before = [], -1
    for e in sorted(looks, key=lambda e: int(e["step"])):
        if int(e["step"]) >= first and before <= last:
            mine.append(e)
        before = int(e["step"])
    if not mine or not any(int(e.get("recompiles") or 0) > 0 for e in mine):
        return None
    limit = next((e for e in looks if e.get("limit_hit")), None)  # (it stays hit)
    compute = steps["compute_s"].astype(float)
    med = float(compute.median())
    slow = steps[(compute > max(COMPILE_STALL_X * med, med + COMPILE_STALL_MIN_S))
                 & (steps["step"] > 0)]  # the run's first step compiles: warm-up's
    if slow.empty:
        return None
    lost = float((slow["compute_s"] - med).sum())
    start = float((steps["ts"] - steps["wait_s"] - steps["compute_s"]).min())
    window_s = float(steps["ts"].max()) - start
    n = sum(int(e["recompiles"]) for e in mine)
    reasons = [r for e in mine for r in e.get("reasons") or ()]
    changes, modes = shape_changes(reasons), mode_changes(reasons)
    at = ", ".join(str(int(s)) for s in slow["step"].head(SHOWN_STEPS)) + \
        (", ..." if len(slow) > SHOWN_STEPS else "")
    share = lost / window_s if window_s > 0 else math.nan
    said = described(changes)
    why = (" on a change of " + " and of ".join(MODES.get(m, m) for m in modes) +
           ", not of shapes (an evaluation inside the training loop?): dynamo keeps a graph "
           "for each mode, each compiled once, which a longer run amortises") if modes else \
        " on new shapes" + (f" ({said})" if said else "")
    text = (f"Steps stalled while torch.compile compiled again: {n} recompile"
            f"{'s' if n != 1 else ''}{why}; {len(slow)} step{'s' if len(slow) != 1 else ''} "
            f"took {float(slow['compute_s'].mean()):.2f} s"
            f"{' each' if len(slow) != 1 else ''} against a median step of "
            f"{med * 1e3:.0f} ms (steps {at}), {lost:.1f} s lost, {share:.0%} of this "
            "window. The device waits while it compiles: more workers cannot help." + (
                f" By step {int(limit['step'])} it hit dynamo's recompile_limit: shapes new "
                "since then run uncompiled (eager), slower than compiled, and are not "
                "counted as lost here." if limit is not None and int(limit["step"]) <= last
                else ""))
    pred = throughput * window_s / (window_s - lost) if 0 < lost < window_s and \
        throughput > 0 else None
    short = any(d == 0 and b < a for d, a, b in changes)
    other = any(d > 0 for d, _, _ in changes)
    advice: list[Advice] = []
    if other or not (changes or modes):
        dims = sorted({d for d, _, _ in changes if d > 0}) or [1]
        advice.append(Advice(
            "model", "one shape for every batch", pred,
            "pad each batch to one of a few fixed lengths (buckets) in the collate_fn, or "
            f"let one graph take every length: torch._dynamo.mark_dynamic(x, {dims[0]}) on "
            "the batch, or torch.compile(dynamic=None) instead of dynamic=False"))
    if short:
        advice.append(Advice(
            "drop_last", True, None if other else pred,
            "drop_last=True: the epoch's short last batch is a shape of its own, compiled "
            "again (or pad it to the batch size)"))
    return Finding(RECOMPILES, text, {"recompiles": n, "slow_steps": slow["step"].astype(int)
                                      .tolist()[:50], "lost_s": lost, "share": share,
                                      "changes": [list(c) for c in changes],
                                      "modes": modes or [],
                                      "limit_hit_by_step": int(limit["step"])
                                      if limit is not None else None},
                   tuple(advice), no_more_workers=True, leads=True)
