"""The one path from a window of a run to its assessment: summary, features, bound, verdict,
advice and evidence. The page, `measure`, `run --json`, sweeps and the autotuner all call
`assess`; they differ only in which window they pick, and the two choices live here too:

- `steady_window`: a run's final loader settings (its last config generation), less the
  warm-up (thresholds.warmup_seconds of that span); of a long run, its last STEADY_MAX_S.
  What measure, run, sweep and tune report, and what the page shows for a run that ended.
- `recent_window`: the page's live KPI window, the last KPI_WINDOW_S seconds, or less since the
  last loader change (its warm-up discarded).
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from monitor.assess import history, same_runs
from monitor.assess import phases as step_phases
from monitor.assess.devices import window_gpu_util
from monitor.diagnosis import Diagnosis, Features, causes, diagnose, features
from monitor.diagnosis.causes import Finding
from monitor.diagnosis.kinds import in_loader_terms
from monitor.diagnosis.per_rank import cache_per_rank
from monitor.diagnosis.rules import HEALTHY
from monitor.diagnosis.straggler import RankFigures, straggler_diagnosis, stragglers
from monitor.frames import analysis
from monitor.records import (
    COMPILE,
    CONFIG,
    EPOCH,
    LOADER,
    LOADER_ERROR,
    STALLED,
    SYNCS,
    WORKERS_READY,
    CpuBudget,
)
from monitor.thresholds import (
    KPI_WINDOW_S,
    STEADY_MAX_S,
    VERDICT_MIN_STEPS,
    WARMUP_READ_STEPS,
    warmup_seconds,
)

if TYPE_CHECKING:
    from monitor.store import Store

UNKNOWN = "unknown"  # accelerator kind of a run that has not said (an older store file)


@dataclass(frozen=True, slots=True)
class Context:
    """What the machine allows, read once by the caller (Runtime.context())."""

    budget: CpuBudget
    max_workers: int
    memory_budget_mb: float | None = None
    # measured / predicted of this machine's changes so far, by the limit predicted
    prediction_scales: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Window:
    """Steps and host samples of one run over one stretch of time, with a caption that says
    which stretch (for the page)."""

    run: dict[str, Any]
    steps: pd.DataFrame
    host: pd.DataFrame
    caption: str = ""
    ranks: pd.DataFrame | None = None  # a job's ranks (store.ranks): host, pid, config
    warmup: dict[str, Any] | None = None  # the run's warm-up (a steady state's: analysis.warmup)
    # the probe's last `loader` report and the loader's errors (monitor/probe/workers.py)
    loader_report: dict[str, Any] | None = None
    loader_errors: tuple[str, ...] = ()
    # the run's loader generations that ended, with what each measured (history.generations)
    history: tuple[dict[str, Any], ...] = ()
    note: str = ""  # a sentence the verdict carries about the window (settings it lacks)
    gpu_util: float | None = None  # NVML's utilisation of the run's GPU over it (0..100)
    same_runs: tuple[dict[str, Any], ...] = ()  # earlier identical runs' ends (same_runs.py)

    @property
    def accelerator(self) -> str:
        return self.run.get("accelerator_kind") or UNKNOWN


@dataclass(frozen=True, slots=True)
class Assessment:
    run_id: int | None
    features: Features
    diagnosis: Diagnosis
    window_throughputs: tuple[float, ...] = ()  # the window cut into equal parts
    start: float = math.nan  # wall-clock span of the window's steps
    end: float = math.nan
    ranks: tuple[RankFigures, ...] = ()  # per rank, for a job of several
    findings: tuple[Finding, ...] = ()  # the causes named (monitor/diagnosis/causes.py)
    workers: tuple[dict[str, Any], ...] = ()  # each DataLoader worker (causes.worker_table)
    world_size: int = 1  # the job's ranks, as its probes report (this store may hold fewer)
    phases: dict[str, Any] | None = None  # the steps' phases (monitor/assess/phases.py)

    @property
    def verdict(self) -> str:
        return self.diagnosis.verdict

    @property
    def summary(self) -> analysis.Summary:
        f = self.features
        return analysis.Summary(f.steps, f.window_s, f.throughput, f.data_wait_share,
                                f.device_busy_mean, f.device_busy_cv, f.between_epochs_s)

    @property
    def throughput_spread(self) -> float | None:
        """(max - min) / median of the parts' throughputs."""
        w = sorted(self.window_throughputs)
        med = statistics.median(w) if len(w) >= 2 else 0.0
        return (w[-1] - w[0]) / med if med > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The keys every JSON carries for a window (measure, run, sweep rows)."""
        f = self.features.to_dict()
        dg = self.diagnosis
        return {
            **self.summary.to_dict(), "verdict": dg.named, "verdict_family": dg.verdict,
            "verdict_text": dg.headline,
            "throughput_windows": list(self.window_throughputs),
            "throughput_spread": self.throughput_spread,
            "peak_memory_mb": f["workload_peak_mb"], "accelerator_kind": f["accelerator"],
            "bound": dg.bound, "advice": [a.to_dict() for a in dg.advice],
            # (fed: the verdict's own line, its noise and identical runs' ends included)
            "evidence": {**{k: v for k, v in f.items() if k != "config"},
                         "fed": self.features.fed},
            "world_size": max(1, len(self.ranks), self.world_size),
            "ranks_held": [r.rank for r in self.ranks],
            "findings": [x.to_dict() for x in self.findings],
            "workers": [_clean(w) for w in self.workers],
            "ranks": [_clean(r.to_dict()) for r in self.ranks],
            "phases": self.phases,
        }


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def _host_of(store: Store, run_id: int, start: float, end: float) -> pd.DataFrame:
    return analysis.run_rows(store.host_samples(start, end), run_id)


def steady_window(store: Store, run_id: int) -> Window | None:
    """The run's final loader settings, warm-up discarded (None: no such run)."""
    run = store.run(run_id)
    if run is None:
        return None
    last = store.last_step_ts(run_id)
    if last is None:
        steps = store.steps(run_id)
        report, errors = loader_notes(store.events(run_id, kinds=LOADER_KINDS))
        return Window(run, steps, steps.iloc[0:0], "no steps yet", None, None, report, errors)
    steps = store.steps(run_id, since=last - STEADY_MAX_S)  # a day-long run: its last minutes
    cut = analysis.span(steps)[0] > float(run["started_at"]) + 1.0 and \
        store.steps(run_id, since=last - STEADY_MAX_S - 5.0, until=last - STEADY_MAX_S
                    ).shape[0] > 0
    if "rank" in steps.columns:  # each rank's final settings (ranks change on their own)
        steps = steps[steps["config_seq"] == steps.groupby("rank")["config_seq"]
                      .transform("max")]
    else:
        steps = steps[steps["config_seq"] == steps["config_seq"].max()]
    settled = steps if cut else _settled(steps)
    if len(settled) >= VERDICT_MIN_STEPS:
        steps = settled
    start, end = analysis.span(steps)
    report, errors = loader_notes(store.events(run_id, kinds=LOADER_KINDS))
    events = store.events(run_id, kinds=(CONFIG,))
    caption, note = f"steady state of the final settings ({end - start:.0f} s)", ""
    ranks = steps["rank"].dropna().unique() if "rank" in steps.columns else []
    late = history.unrecorded_change(events, int(steps["config_seq"].max()),
                                     int(ranks[0]) if len(ranks) else None) \
        if len(ranks) <= 1 and "config_seq" in steps.columns else None
    if late is not None:  # a change just before the end: the steps are of the settings before
        run = {**run, "config": {**(run.get("config") or {}), **late[0]}}
        caption = f"steady state of the settings before the last change ({end - start:.0f} s)"
        note = (f"The last change ({late[1]}) recorded no step before the run ended: this is "
                "of the settings before it.")
    return Window(run, steps, _host_of(store, run_id, start, end), caption,
                  store.ranks(run_id), _warmup(store, run_id, steps, last), report, errors,
                  run_history(store, run_id, steps, events), note,
                  window_gpu_util(store, run, start, end), same_runs.earlier(store, run))


def run_history(store: Store, run_id: int, steps: pd.DataFrame,
                events: pd.DataFrame | None = None) -> tuple[dict[str, Any], ...]:
    """The ended generations of a run of one rank (history.generations); a job's ranks
    change on their own, and its findings speak for one rank's window only."""
    ranks = steps["rank"].dropna().unique() if "rank" in steps.columns else []
    if len(ranks) > 1:
        return ()
    if events is None:
        events = store.events(run_id, kinds=(CONFIG,))
    return history.generations(store, run_id, events, int(ranks[0]) if len(ranks) else None)


LOADER_KINDS = (LOADER, EPOCH, WORKERS_READY, LOADER_ERROR, STALLED, COMPILE, SYNCS)


def _settled(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps after their warm-up, each rank's from its own first step (ranks start
    apart: one cut from the earliest rank's start kept a late rank's start-up and left an
    early rank 0.37 s of a two-rank job's steps)."""
    def cut(own: pd.DataFrame) -> pd.DataFrame:
        start, end = analysis.span(own)
        return analysis.steady_state(own, warmup_seconds(end - start))
    if "rank" not in steps.columns or steps["rank"].nunique() < 2:
        return cut(steps)
    return pd.concat([cut(own) for _, own in steps.groupby("rank", sort=False)]).sort_index()


def loader_notes(events: pd.DataFrame) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """The probe's last `loader` report and the loader's errors, from a run's events."""
    if events is None or events.empty:
        return None, ()
    def last(kind: str) -> dict[int, dict[str, Any]]:  # a job's ranks each write theirs
        out: dict[int, dict[str, Any]] = {}
        for text in events.loc[events["kind"] == kind, "data"]:
            d = json.loads(text) if text else {}
            out[int(d.get("rank") or 0)] = d
        return out
    reports, pids, ready = last(LOADER), last(EPOCH), last(WORKERS_READY)
    for r, d in reports.items():  # the workers by index (the iterator's order), their start
        d["worker_pids"] = pids.get(r, {}).get("worker_pids")
        if ready.get(r, {}).get("epoch") == d.get("epoch"):
            d["ready_s"] = ready[r].get("ready_s")
    report = None
    rep = events[events["kind"] == LOADER]
    if not rep.empty:
        report = {**reports[int(json.loads(rep["data"].iloc[-1]).get("rank") or 0)],
                  "by_rank": reports}
        # torch.compile's looks and the sync counts (monitor/probe/compiles.py, syncs.py):
        # the report's rank's
        for kind, key in ((COMPILE, "compiles"), (SYNCS, "syncs")):
            report[key] = [d for d in (json.loads(x) for x in events.loc[
                events["kind"] == kind, "data"] if x) if int(d.get("rank") or 0) ==
                int(report.get("rank") or 0)]
    errors = tuple(str(x) for k, x in zip(events["kind"], events["label"], strict=True)
                   if k == LOADER_ERROR or (k == STALLED and (
                       "Open files:" in str(x) or "Tokenizers after fork:" in str(x))))
    return report, errors


def _warmup(store: Store, run_id: int, steady: pd.DataFrame, last: float,
            ) -> dict[str, Any] | None:
    """The run's warm-up against its steady step time (one rank's: the lowest)."""
    first = store.first_steps(run_id, WARMUP_READ_STEPS)
    if first.empty or steady.empty:
        return None
    if "rank" in first.columns and first["rank"].notna().any():
        low = first["rank"].min()
        first, steady = analysis.rank_rows(first, low), analysis.rank_rows(steady, low)
    steady_step = float((steady["wait_s"] + steady["compute_s"]).median()) \
        if not steady.empty else math.nan
    run_s = last - float(analysis.starts(first).iloc[0])
    return analysis.warmup(first, steady_step, run_s)


def recent_window(run: dict[str, Any], steps: pd.DataFrame, host: pd.DataFrame,
                  events: pd.DataFrame, end: float,
                  ranks: pd.DataFrame | None = None) -> Window:
    """The page's live window: the last KPI_WINDOW_S, or less after a loader change."""
    steps = steps[steps["ts"] >= end - KPI_WINDOW_S]
    cfg = events[events["kind"] == CONFIG] if not events.empty else events
    caption = f"last {KPI_WINDOW_S:.0f} s"
    if len(cfg) > 1:
        since = float(cfg["ts"].iloc[-1])
        if since > end - KPI_WINDOW_S:
            settle = warmup_seconds(KPI_WINDOW_S)
            steps = steps[analysis.starts(steps) >= since + settle]
            caption = (f"{end - since:.0f} s since the last change"
                       if len(steps) >= VERDICT_MIN_STEPS else "settling after the last change")
    if not host.empty and not steps.empty:
        start, stop = analysis.span(steps)
        host = host[(host["ts"] >= start) & (host["ts"] <= stop)]
    report, errors = loader_notes(events)
    return Window(run, steps, host, caption, ranks, None, report, errors)


def split_throughputs(steps: pd.DataFrame, parts: int) -> tuple[float, ...]:
    """Throughput of each of `parts` equal stretches of the steps' span (empty ones left
    out)."""
    if steps.empty or parts < 2:
        return ()
    start, end = analysis.span(steps)
    edges = [start + (end - start) * i / parts for i in range(parts + 1)]
    out = (analysis.throughput(steps[(steps["ts"] >= a) & (steps["ts"] < b)])
           for a, b in zip(edges[:-1], edges[1:], strict=True))
    return tuple(t for t in out if not math.isnan(t))


def _one(window: Window, ctx: Context, config: dict[str, Any], host: pd.DataFrame,
         steps: pd.DataFrame) -> tuple[Features, Diagnosis]:
    f = features(steps, host, config, ctx.budget, window.accelerator, ctx.memory_budget_mb,
                 window.warmup)
    f = same_runs.anchor(f, window.same_runs)  # NOTE [identical runs]
    return f, diagnose(f, ctx.max_workers, ctx.prediction_scales)


def assess(window: Window, ctx: Context, parts: int = 1) -> Assessment:
    """Summary, features, bound, verdict and advice of one window; for a job of several
    ranks, each rank's too, and the input-straggler verdict when one stands out."""
    steps = window.steps
    start, end = analysis.span(steps) if not steps.empty else (math.nan,) * 2
    ranks = sorted(int(r) for r in steps["rank"].unique()) if "rank" in steps.columns \
        and not steps.empty else []
    base = dict(run_id=window.run.get("id"), window_throughputs=split_throughputs(steps, parts),
                start=start, end=end, world_size=_world_size(window),
                phases=step_phases.shares(steps))
    if len(ranks) <= 1:
        host = window.host
        own = analysis.own_rows(host, ranks[0]) if ranks else host.iloc[0:0]
        host = own if not own.empty else host  # the rank's own samples, else the node's
        f, dg = _one(window, ctx, _own_config(window, ranks), host, steps)
        report = window.loader_report or {  # a live window past the epoch's report
            "num_workers": int(f.config.get("num_workers") or 0)}
        found = causes.find(steps, host, report, list(window.loader_errors), f.throughput,
                            window.history, f.loaders_runq_share, f, window.gpu_util)
        dg = causes.with_findings(dg, found, f, int(f.config.get("num_workers") or 0))
        dg = in_loader_terms(_fed_phases(dg, base["phases"]), f.config)
        for said in (same_runs.sentence(f) if f.judged_as else "", window.note):
            dg = dataclasses.replace(dg, headline=f"{dg.headline} {said}") if said else dg
        return Assessment(features=f, diagnosis=dg, findings=found,
                          workers=causes.worker_table(steps, host, report), ranks=tuple(
            _figures(window, r, f) for r in ranks) if ranks else (), **base)
    return _assess_job(window, ctx, ranks, base)


def _fed_phases(dg: Diagnosis, ph: dict[str, Any] | None) -> Diagnosis:
    """A fed device's verdict names where its step goes: the next place to look."""
    if ph is None or dg.verdict != HEALTHY:
        return dg
    said = step_phases.sentence(ph)
    return dataclasses.replace(dg, headline=f"{dg.headline} {said}") if said else dg


def _world_size(window: Window) -> int:
    """The job's world size as its ranks reported it (a store of one node holds only some)."""
    r = window.ranks
    if r is None or r.empty or "world_size" not in r.columns:
        return 1
    sizes = pd.to_numeric(r["world_size"], errors="coerce").dropna()
    return int(sizes.max()) if not sizes.empty else 1


def _own_config(window: Window, ranks: list[int]) -> dict[str, Any]:
    """The loader settings of a run's one rank: the run's record, else (a store holding a
    rank other than 0, whose probe does not speak for the run) that rank's own report."""
    config = window.run.get("config") or {}
    if "batch_size" in config or not ranks:
        return config
    own = _rank_record(window, ranks[0])
    return {**config, **own["config"]} if own is not None else config


def _rank_record(window: Window, rank: int) -> dict[str, Any] | None:
    """The ranks table's row of `rank` (its host, settings, device), None if not stored."""
    r = window.ranks
    if r is None or r.empty:
        return None
    own = analysis.own_rows(r, rank)
    return own.iloc[0].to_dict() if not own.empty else None


def _local_ranks(window: Window, ranks: list[int]) -> dict[int, set[int]]:
    """Each rank's job ranks on its own host (itself included), by the hostname its probe
    reported; ranks with no hostname on record are taken to share one host."""
    r = window.ranks
    host: dict[int, Any] = {}
    if r is not None and not r.empty and "hostname" in r.columns:
        host = {int(k): v for k, v in zip(r["rank"], r["hostname"], strict=True)}
    return {k: {j for j in ranks if host.get(j) == host.get(k)} for k in ranks}


def _rank_config(window: Window, rank: int) -> dict[str, Any]:
    own = _rank_record(window, rank)
    return (own or {}).get("config") or window.run.get("config") or {}


def _figures(window: Window, rank: int, f: Features) -> RankFigures:
    row = _rank_record(window, rank)
    return RankFigures(rank, None if row is None else row["hostname"], f.steps, f.throughput,
                       f.data_wait_share, f.wait_per_step_s, f.compute_per_step_s,
                       f.config.get("num_workers"), f.workers_cpu_cores, f.workload_mem_mb)


def _assess_job(window: Window, ctx: Context, ranks: list[int], base: dict) -> Assessment:
    """Each rank alone, then the job: Σ throughput, pooled shares; the straggler verdict
    when a rank stands out, else the most starved rank's verdict (all wait alike)."""
    host = window.host
    per: dict[int, Features] = {}
    own: dict[int, Diagnosis] = {}
    for r in ranks:
        per[r], own[r] = _one(window, ctx, _rank_config(window, r), analysis.own_rows(host, r),
                              analysis.rank_rows(window.steps, r))
    # a rank's "other processes" are not its sibling ranks: they are the same job
    job_cpu = {r: (f.main_cpu_cores or 0.0) + (f.workers_cpu_cores or 0.0)
               for r, f in per.items()}
    local = _local_ranks(window, ranks)
    for r, f in per.items():
        if f.other_cpu_cores is not None:
            siblings = sum(v for k, v in job_cpu.items() if k != r and k in local[r])
            f = dataclasses.replace(f, other_cpu_cores=max(0.0, f.other_cpu_cores - siblings))
        per[r] = f = dataclasses.replace(f, local_ranks=len(local[r]))
        own[r] = diagnose(f, ctx.max_workers, ctx.prediction_scales)
    rep = max(per, key=lambda r: per[r].data_wait_share)
    steps = window.steps
    job = dataclasses.replace(
        per[rep], steps=len(steps), throughput=sum(f.throughput for f in per.values()),
        data_wait_share=analysis.data_wait_share(steps),
        device_busy_mean=statistics.mean(f.device_busy_mean for f in per.values()))
    slow = stragglers({r: f.wait_per_step_s for r, f in per.items()})
    dg = straggler_diagnosis(job, per, own, slow) if slow else own[rep]
    # the causes, of the rank the verdict speaks for (the straggler, else the most starved)
    who = slow[0] if slow and slow[0] in per else rep
    mine = analysis.rank_rows(steps, who)
    h = analysis.own_rows(host, who)
    report = ((window.loader_report or {}).get("by_rank") or {}).get(who) or \
        {"num_workers": per[who].num_workers}
    found = tuple(dataclasses.replace(x, text=f"rank {who}: {x.text}") for x in causes.find(
        mine, h, report, list(window.loader_errors), per[who].throughput,
        cpu_wait_share=per[who].loaders_runq_share, features=per[who]))
    copies = cache_per_rank((window.loader_report or {}).get("by_rank") or {}, local,
                            per[who].mem_total_mb, per[who].memory_budget_mb)
    found = (*found, copies) if copies is not None else found
    dg = causes.with_findings(dg, found, job, per[who].num_workers)
    dg = _fed_phases(dg, base["phases"])
    return Assessment(features=job, diagnosis=dg, findings=found,
                      workers=causes.worker_table(mine, h, report),
                      ranks=tuple(_figures(window, r, per[r]) for r in ranks), **base)


def assess_run(store: Store, run_id: int, ctx: Context, parts: int = 1) -> Assessment | None:
    """assess(steady_window(...)): what measure, run --json and sweep rows report, naming
    the cause that held for most of the run (monitor/assess/held.py)."""
    from monitor.assess.held import keep_held

    w = steady_window(store, run_id)
    return keep_held(w, assess(w, ctx, parts)) if w is not None else None
