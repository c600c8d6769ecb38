"""Runs side by side, and the regression gate: what differs in their settings, their
steady-state figures with deltas against the first run, and whether a throughput drop is
beyond both the allowed regression and the runs' own noise.

Noise: each run's steady window is cut into NOISE_PARTS equal parts; two runs differ beyond
noise when |B - A| > NOISE_Z x sqrt(se_A^2 + se_B^2) (monitor/thresholds.py: std_error,
noise_band).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monitor.assess.window import Context, assess_run
from monitor.config import SHOWN_SETTINGS
from monitor.thresholds import (
    HOST_BUSIER_CORES,
    HOST_BUSIER_RUNQ,
    HOST_STEP_CHANGE,
    MAX_REGRESSION_PCT,
    NOISE_PARTS,
    noise_band,
    std_error,
)

if TYPE_CHECKING:
    from monitor.store import Store

KPIS = ("throughput", "data_wait_share", "device_busy_mean", "peak_memory_mb")
KPI_ROWS = (("throughput", "throughput (samples/s)", "{:,.1f}"),  # key, label, format
            ("data_wait_share", "data-wait share", "{:.1%}"),
            ("device_busy_mean", "device busy, mean", "{:.1%}"),
            ("peak_memory_mb", "peak memory (MB)", "{:,.0f}"),
            ("verdict", "verdict", "{}"))


class CompareError(ValueError):
    """A run that cannot be compared; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Side:
    run_id: int
    name: str
    config: dict[str, Any]
    figures: dict[str, Any]  # Assessment.to_dict() of the steady state

    @property
    def std_error(self) -> float | None:
        return std_error(self.figures.get("throughput_windows") or [])


def load(store: Store, spec: str, ctx: Context) -> Side:
    run_id = store.resolve_run(spec)
    if run_id is None:
        raise CompareError(f"no run {spec!r} in the store {store.path}: give a run id, "
                           "latest, latest~1 or name:NAME")
    run = store.run(run_id) or {}
    a = assess_run(store, run_id, ctx, parts=NOISE_PARTS)
    if a is None or not a.features.steps:
        raise CompareError(f"run {run_id} has no steps to compare")
    return Side(run_id, str(run.get("name")), dict(run.get("config") or {}), a.to_dict())


def settings_diff(sides: list[Side]) -> tuple[dict[str, list], dict[str, Any]]:
    """(settings that differ: values per run, settings all runs share)."""
    keys = [k for k in SHOWN_SETTINGS if any(k in s.config for s in sides)]
    diff = {k: [s.config.get(k) for s in sides] for k in keys
            if len({repr(s.config.get(k)) for s in sides}) > 1}
    same = {k: sides[0].config.get(k) for k in keys if k not in diff}
    return diff, same


def delta(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not a:
        return None
    return (b - a) / abs(a)


def host_context(s: Side) -> dict[str, Any]:
    """What the run's host was like (stored with its assessment): other processes' CPU, the
    loaders' CPU wait, usable cores, the device step."""
    ev = s.figures.get("evidence") or {}
    return {"other_cpu_cores": ev.get("other_cpu_cores"),
            "loaders_runq_share": ev.get("loaders_runq_share"),
            "usable_cores": ev.get("usable_cores"),
            "compute_per_step_s": ev.get("compute_per_step_s")}


def busier(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why B's host explains a slower B (None when it does not): the words of the verdict."""
    why = []
    oa, ob = a.get("other_cpu_cores"), b.get("other_cpu_cores")
    if oa is not None and ob is not None and ob - oa >= HOST_BUSIER_CORES:
        why.append(f"other processes {ob:.1f} vs {oa:.1f} cores")
    qa, qb = a.get("loaders_runq_share"), b.get("loaders_runq_share")
    if qa is not None and qb is not None and qb - qa >= HOST_BUSIER_RUNQ:
        why.append(f"loaders waited {qb:.0%} vs {qa:.0%} of their time for a CPU")
    ca, cb = a.get("usable_cores"), b.get("usable_cores")
    if ca and cb and cb < ca:
        why.append(f"{cb} vs {ca} usable cores")
    da, db = a.get("compute_per_step_s"), b.get("compute_per_step_s")
    if da and db and abs(db / da - 1) > HOST_STEP_CHANGE:
        why.append(f"device step {db * 1000:.0f} vs {da * 1000:.0f} ms")
    return "; ".join(why) or None


def gate(a: Side, b: Side, max_regression_pct: float) -> tuple[bool, str]:
    """(failed, sentence): B fails when its throughput is lower than A's by more than the
    threshold and by more than the noise, and its host does not explain it (else the
    sentence starts "inconclusive" and B does not fail: `gate_state` tells them apart)."""
    ta, tb = a.figures["throughput"], b.figures["throughput"]
    d = delta(ta, tb) or 0.0
    ses = [s.std_error for s in (a, b)]
    noise = noise_band(ses) / ta if None not in ses else None
    text = (f"run {b.run_id} vs run {a.run_id}: throughput {tb:,.0f} vs {ta:,.0f} samples/s "
            f"({d:+.1%})")
    beyond_noise = noise is None or abs(d) > noise
    noise_text = f"noise ±{noise:.1%}" if noise is not None else "noise unknown"
    if -d * 100 > max_regression_pct and beyond_noise:
        host = busier(host_context(a), host_context(b))
        if host is not None:
            return False, (f"inconclusive: run {b.run_id}'s host was busier ({host}): "
                           f"{text}")
        return True, (f"{text}: a regression beyond {max_regression_pct:g}% and beyond the "
                      f"runs' {noise_text}")
    if not beyond_noise:
        return False, f"{text}: within the runs' {noise_text}"
    if d > 0:
        return False, f"{text}: faster, beyond the runs' {noise_text}"
    return False, f"{text}: within the allowed {max_regression_pct:g}% ({noise_text})"


def compare(store: Store, specs: list[str], ctx: Context,
            max_regression_pct: float = MAX_REGRESSION_PCT) -> dict[str, Any]:
    """Everything `monitor compare` prints and the Compare tab shows."""
    if len(specs) < 2:
        raise CompareError("give at least two runs to compare, e.g. latest~1 latest")
    sides = [load(store, s, ctx) for s in specs]
    diff, same = settings_diff(sides)
    base = sides[0]
    kpis = {k: {"values": [s.figures.get(k) for s in sides],
                "delta": [delta(base.figures.get(k), s.figures.get(k)) for s in sides]}
            for k in KPIS}
    kpis["verdict"] = {"values": [s.figures["verdict"] for s in sides]}
    failed, text = gate(base, sides[-1], max_regression_pct)
    state = "regression" if failed else ("inconclusive" if text.startswith("inconclusive")
                                         else "ok")
    return {"runs": [{"run_id": s.run_id, "name": s.name, "window_s": s.figures["window_s"],
                      "throughput_std_error": s.std_error} for s in sides],
            "settings_diff": diff, "settings_same": same, "kpis": kpis,
            "host": [host_context(s) for s in sides],
            "gate": {"failed": failed, "state": state, "text": text,
                     "max_regression_pct": max_regression_pct}}
