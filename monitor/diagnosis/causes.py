"""The causes real jobs starve from, beyond a lab's (too few workers, cores, storage): each a
finding with its numbers and its fix, from what the probe and the sampler saw of the
unmodified script. Pure: frames and the probe's `loader` report in, findings out.

- idle workers: workers that produced no batch in the window while others did (the steps'
  `worker` column); an iterable dataset with fewer shards than workers is the usual cause.
- head-of-line: waits on a batch while later batches sat finished in other workers (the
  steps' `held` column), holding most of the data wait.
- growing worker memory: the slope of the workers' own memory (USS, else RSS) over the
  window, against the memory still available: the minutes left at that rate.
- /dev/shm and open files, before they fail, and a loader error that happened (a killed
  worker, /dev/shm, descriptors), or a hang the watchdog named (the open-files limit; a
  tokenizer's thread pool forked mid-use): monitor/diagnosis/limits.py.
- per-sample overhead: big batches of samples that each cost the loop a few µs, fetched one
  at a time: Python's per-sample call and collate are the cost; a batched fetch
  (`__getitems__`) is the fix, advised first (workers only share the cost out).
- the loop's receive: workers ahead of the loop (a finished batch already queued as it
  asks for each, the steps' `ready`) while it waits: receiving the batch (unpickling, a
  descriptor fetched from the worker for each tensor) is the wait; not more workers.
- recompiles: steps stalled while torch.compile compiled again for new shapes
  (monitor/diagnosis/compiles.py); host syncs on CUDA: the GPU idle inside steps that stop
  the host at synchronizing calls (monitor/diagnosis/syncs.py).
- worker start-up: workers not kept between epochs start again at each: the epoch's
  iter() (where spawn and forkserver pickle the dataset object to each worker), then each
  worker's first batch (it imports torch and unpickles the dataset), from the probe.

A finding whose fix is not more workers says so (`no_more_workers`): the advice engine then
offers no num_workers increase beside it (monitor/assess/window.py merges them).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pandas as pd

from monitor.diagnosis.compiles import RECOMPILES, recompiles
from monitor.diagnosis.costs import (
    PER_SAMPLE,
    RECEIVE,
    SLOWER,
    STARTUP,
    loop_receive,
    per_sample,
    slower_with_more,
    startup,
)
from monitor.diagnosis.finding import Advice, Diagnosis, Finding
from monitor.diagnosis.limits import (
    LOADER_ERROR,
    OOM,
    OPEN_FILES,
    SHM,
    TOKENIZER_FORK,
    WORKER_KILLED,
    failure,
    memory_left,
    open_files,
    shm,
)
from monitor.diagnosis.per_rank import CACHE_PER_RANK
from monitor.diagnosis.remote import REMOTE_READS, remote_reads
from monitor.diagnosis.rules import without_prediction
from monitor.diagnosis.syncs import HOST_SYNCS, host_syncs
from monitor.diagnosis.threads import MAIN_THREADS, WORKER_THREADS, threads_fight
from monitor.thresholds import (
    BY_THE_LINE,
    HOL_BATCH_X,
    HOL_SHARE,
    HOL_WAIT_X,
    IDLE_WORKER_MIN_BATCHES,
    MEM_GROWTH_MB_MIN,
    MEM_GROWTH_MIN_S,
    MEM_GROWTH_MIN_TOTAL_MB,
    by_the_line,
)

IDLE_WORKERS, MEMORY_GROWTH, HEAD_OF_LINE = (
    "idle-workers", "worker-memory-growth", "head-of-line")
# The one vocabulary of causes a finding names (JSON `findings[].cause`, the page)
CAUSES = (MEMORY_GROWTH, SHM, OPEN_FILES, OOM, WORKER_KILLED, LOADER_ERROR, TOKENIZER_FORK,
          IDLE_WORKERS, PER_SAMPLE, RECEIVE, SLOWER, STARTUP, HEAD_OF_LINE, CACHE_PER_RANK,
          REMOTE_READS, WORKER_THREADS, MAIN_THREADS, RECOMPILES, HOST_SYNCS)


def find(steps: pd.DataFrame, host: pd.DataFrame, report: dict[str, Any] | None,
         errors: list[str], throughput: float,
         history: tuple[dict[str, Any], ...] = (),
         cpu_wait_share: float | None = None,
         features: Any = None, gpu_util: float | None = None) -> tuple[Finding, ...]:
    """Every finding the window's evidence (and the run's ended generations, `history`)
    supports, the ones that happened first; `cpu_wait_share`: the loaders' measured wait
    for a CPU (features.loaders_runq_share), so that a cost is judged on a CPU's time;
    `features`: the window's Features (the time split, the threads at work); `gpu_util`:
    NVML's utilisation of the run's GPU over the window (0..100)."""
    happened = [f for f in (failure(e, report, host) for e in errors[-1:]) if f is not None]
    # failures on their way first (they end the job), then what slows it
    coming = [worker_memory(host, _workers_up(steps)), shm(report), open_files(report),
              idle_workers(steps, report, throughput),
              per_sample(steps, report, cpu_wait_share),
              slower_with_more(history, int((report or {}).get("num_workers") or 0),
                               throughput),
              # (after the run's own history: a fewer-workers figure it measured leads)
              loop_receive(report, features) if features is not None else None,
              startup(steps, report, throughput), head_of_line(steps),
              recompiles(steps, report, throughput),
              host_syncs(report, features, gpu_util, throughput)
              if features is not None else None,
              remote_reads(host, steps, features) if features is not None else None,
              threads_fight(features) if features is not None else None]
    seen = {f.cause for f in happened}  # a failure that happened says what the warning would
    seen |= {c for f in coming if f is not None for c in f.supersedes}
    return tuple(happened + [f for f in coming if f is not None and f.cause not in seen])


def worker_table(steps: pd.DataFrame, host: pd.DataFrame,
                 report: dict[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """Each worker over the window: batches it produced (the steps' `worker`), and, by its
    PID (the epoch's worker_pids, in index order), its mean CPU, its memory and state as
    last sampled (the host rows' workers_detail)."""
    nw = int((report or {}).get("num_workers") or 0)
    if nw == 0 or steps.empty or "worker" not in steps.columns:
        return ()
    counts = steps["worker"].dropna().astype(int).value_counts().to_dict()
    total = max(1, sum(counts.values()))
    pids = list((report or {}).get("worker_pids") or [])
    seen: dict[int, list[dict[str, Any]]] = {}
    if not host.empty and "workers_detail" in host.columns:
        for text in host["workers_detail"].dropna():
            for w in json.loads(text):
                seen.setdefault(int(w["pid"]), []).append(w)
    rows = []
    for i in range(nw):
        pid = pids[i] if i < len(pids) else None
        mine = seen.get(pid, []) if pid is not None else []
        cpu = [w["cpu_pct"] for w in mine if w.get("cpu_pct") is not None]
        last = mine[-1] if mine else {}
        n = int(counts.get(i, 0))
        rows.append({"worker": i, "pid": pid, "batches": n, "share": n / total,
                     "cpu_pct": sum(cpu) / len(cpu) if cpu else None,
                     "rss_mb": last.get("rss_mb"), "uss_mb": last.get("uss_mb"),
                     "state": _state(n, last.get("status"))})
    return tuple(rows)


def _state(batches: int, status: str | None) -> str:
    said = {"zombie": "exited", "disk-sleep": "in I/O (disk sleep)"}.get(status or "",
                                                                        status or "")
    return f"no batch, {said}" if batches == 0 and said else "no batch" if batches == 0 \
        else said


def idle_workers(steps: pd.DataFrame, report: dict[str, Any] | None,
                 throughput: float) -> Finding | None:
    nw = int((report or {}).get("num_workers") or 0)
    if nw < 2 or steps.empty or "worker" not in steps.columns:
        return None
    w = steps["worker"].dropna().astype(int)
    if len(w) < IDLE_WORKER_MIN_BATCHES:
        return None
    counts = w.value_counts().to_dict()
    idle = [i for i in range(nw) if counts.get(i, 0) == 0]
    if not idle:
        return None
    busy = sorted(counts)
    made = ", ".join(f"worker {i}: {counts[i]}" for i in busy)
    shards = report.get("shards") if report else None
    if report and report.get("iterable"):
        why = (f"the iterable dataset {report.get('dataset')} feeds only {len(busy)} of them"
               + (f" ({shards} shard{'s' if shards != 1 else ''} for {nw} workers)"
                  if shards else "") + ": each worker reads its own shards, and one with "
               "none yields nothing")
        fix = (f"split the data into at least {nw} shards (more files; a Hugging Face "
               f"dataset: to_iterable_dataset(num_shards={nw}) or .shard(); WebDataset: at "
               f"least {nw} tar files)")
    else:
        why = "their samples never reach them (a sampler or worker_init_fn that skips them)"
        fix = "check the sampler and worker_init_fn: every worker should get indices"
    text = (f"{len(idle)} of {nw} DataLoader workers produced no batch in this window "
            f"({made}): {why}. More workers will not help.")
    advice = (Advice("dataset", f"at least {nw} shards", None, fix),
              Advice("num_workers", len(busy), throughput if throughput > 0 else None,
                     f"until then, num_workers={len(busy)} does the same work with "
                     f"{len(idle)} fewer processes (their memory and start-up)"))
    return Finding(IDLE_WORKERS, text, {"workers": nw, "idle": idle, "batches": counts,
                                        "shards": shards}, advice, no_more_workers=True)


def head_of_line(steps: pd.DataFrame) -> Finding | None:
    """Waits spent on one batch while later ones sat finished in other workers (the steps'
    `held` column): a slow sample holding the in-order queue."""
    if steps.empty or "held" not in steps.columns or steps["held"].notna().sum() < 20:
        return None
    wait = steps["wait_s"]
    total = float(wait.sum())
    # longer than a worker takes to make a batch at the loop's pace (n workers, one batch a
    # step each in turn): a uniform pipeline in order waits that long for every n-th batch
    # while the next sits finished (2 workers of equal 48 ms batches: 43 of 170 steps),
    # which is no slow sample. The loop's pace is the mean step without its slowest tenth,
    # not the median: where every other batch waits a whole turn (2 workers, 17 ms remote
    # reads a sample: bimodal waits) the median step is the short half, and a uniform
    # pipeline read head-of-line; the plain mean let a busy box's rare slow batches lift the
    # floor over themselves (the head-of-line reproducer went unnamed)
    workers = max(1, int(steps["worker"].dropna().nunique())) if "worker" in steps.columns \
        else 1
    step = (wait + steps["compute_s"]).sort_values()
    pace = float(step.iloc[:max(1, int(len(step) * 0.9))].mean())  # the slowest tenth out
    floor = max(HOL_WAIT_X * max(float(wait.median()), 1e-4), HOL_BATCH_X * workers * pace)
    long = steps[(steps["held"].fillna(0) >= 1) & (wait > floor)]
    held_wait = float(long["wait_s"].sum())
    if len(long) < 3 or total <= 0 or held_wait < HOL_SHARE * total:
        return None
    held = int(long["held"].median())
    # in any order, the loop takes the finished batches instead: a slow batch then costs
    # only its own worker that time, one of n, not the whole pipeline (an upper bound of all
    # of it back read 1,119 against 656 measured; this 531)
    n = max(1, int(steps["worker"].dropna().nunique())) if "worker" in steps.columns else 1
    excess = float((long["wait_s"] - float(wait.median())).clip(lower=0).sum())
    loop = total + float(steps["compute_s"].sum())
    pred = float(steps["samples"].sum()) / (loop - excess + excess / n) \
        if loop > excess > 0 and n > 1 else None
    text = (f"{held_wait / total:.0%} of the data wait ({held_wait:,.1f} s of {total:,.1f} s) "
            f"was spent on {len(long)} batches while {held} later batches sat finished in "
            "other workers (median): one slow sample (a huge image, a long record) holds "
            "the in-order queue, and the loop waits behind it")
    gain = f"; predicted {pred:,.0f} samples/s without those waits" if pred else ""
    fix = ("DataLoader(..., in_order=False) (torch 2.6 and later) hands batches over as they "
           "finish, so a slow one no longer holds the others back (batch order then varies "
           f"between runs){gain}; or give the slow samples less work (resize offline)")
    return Finding(HEAD_OF_LINE, text, {"held_wait_s": held_wait, "wait_s": total,
                                        "batches": len(long), "held_median": held},
                   (Advice("in_order", False, pred, fix),))


def _slope(ts: pd.Series, ys: pd.Series) -> float:
    t = ts - ts.iloc[0]
    var = float(((t - t.mean()) ** 2).sum())
    return float(((t - t.mean()) * (ys - ys.mean())).sum()) / var if var > 0 else math.nan


def _growth(host: pd.DataFrame, col: str) -> tuple[pd.DataFrame, float] | None:
    """(the stretch, MB/min) where the workers' `col` grows, sustained: over the last set
    of workers (a restart at an epoch starts them small again), at least MEM_GROWTH_MIN_S
    long, and still growing in its later half, rising at least twice (workers that touch
    their pages once, then hold them, are warm, not growing)."""
    if col not in host.columns:
        return None
    h = host[["ts", col, "workers", *(c for c in ("mem_available_mb", "cgroup_mem_limit_mb",
                                                  "cgroup_mem_used_mb") if c in host.columns)]
             ].copy()
    h["gen"] = (h["workers"].fillna(0) <= 0).cumsum()  # a new set after each gap
    h = h[(h["workers"].fillna(0) > 0) & (h[col] > 0)].dropna(subset=[col])
    if h.empty:
        return None
    h = h[h["gen"] == h["gen"].iloc[-1]]
    if len(h) < 5 or float(h["ts"].iloc[-1] - h["ts"].iloc[0]) < MEM_GROWTH_MIN_S:
        return None
    later = h[h["ts"] >= (h["ts"].iloc[0] + h["ts"].iloc[-1]) / 2]
    per_min = _slope(h["ts"], h[col]) * 60.0
    grown = per_min * float(h["ts"].iloc[-1] - h["ts"].iloc[0]) / 60.0
    # (and by enough to tell from warm-up: 2 workers of a pool's threads grew 7 MB in 6 s,
    # 74 MB/min, "out of memory in 316 min")
    if not (per_min > MEM_GROWTH_MB_MIN and _slope(later["ts"], later[col]) * 60.0 >
            MEM_GROWTH_MB_MIN and (later[col].diff() > 0).sum() >= 2
            and grown >= MEM_GROWTH_MIN_TOTAL_MB):
        return None
    return h, per_min


def _workers_up(steps: pd.DataFrame) -> float | None:
    """When the window's last epoch delivered its first batch: its workers were up (a
    spawned worker's memory grows as it imports torch, before that: start-up, not growth)."""
    if steps.empty or "epoch" not in steps.columns:
        return None
    last = steps[steps["epoch"] == steps["epoch"].max()]
    return float(last["ts"].min()) if not last.empty else None


def worker_memory(host: pd.DataFrame, since: float | None = None) -> Finding | None:
    """The workers' memory growing toward the limit that binds them; `since`: when they
    were up (host rows before it are their start-up)."""
    if since is not None and not host.empty and "ts" in host.columns:
        host = host[host["ts"] >= since]
    if host.empty or "ts" not in host.columns or "workers" not in host.columns:
        return None
    # USS where it is measured: RSS also grows as workers touch pages they share (a forked
    # dataset read, not copied), which is no memory spent
    col = next((c for c in ("workers_uss_mb", "workers_rss_mb") if c in host.columns
                and (host[c] > 0).sum() >= 5), None)
    g = _growth(host, col) if col is not None else None
    if g is None:
        return None
    h, per_min = g
    workers = max(1, int(h["workers"].iloc[-1] or 1))
    now = float(h[col].iloc[-1])
    left, what, limit = memory_left(h)
    minutes = left / per_min if left is not None and per_min > 0 else None
    when = (f": at this rate {what} runs out of memory in about {minutes:,.0f} min "
            f"({left:,.0f} MB {'left under its limit' if limit else 'available'})"
            if minutes is not None else "")
    kind = "USS" if col == "workers_uss_mb" else "RSS"
    text = (f"the DataLoader workers' memory grows {per_min:,.0f} MB/min "
            f"({per_min / workers:,.0f} MB/min a worker, {kind} {now:,.0f} MB now){when}. "
            "That is a per-sample cache that never evicts, or a dataset of Python objects "
            "(lists, dicts) that every forked worker copies page by page as it reads them.")
    fix = ("bound the cache (functools.lru_cache(maxsize=...)) or drop it; keep the dataset "
           "in arrays (numpy, Arrow, a memory-mapped file) rather than Python lists and "
           "dicts; or run fewer workers, each with the memory it needs")
    return Finding(MEMORY_GROWTH, text, {"mb_per_min": per_min, "per_worker_mb_per_min":
                                         per_min / workers, "memory_mb": now,
                                         "available_mb": left, "minutes_left": minutes,
                                         "cgroup_limit_mb": limit},
                   (Advice("dataset", "bounded cache, arrays", None, fix),),
                   no_more_workers=True)


def lead(findings: tuple[Finding, ...]) -> Finding | None:
    """The finding the verdict names: one that rules out more workers, else one that leads,
    else the first (a failure that happened comes first)."""
    return next((x for x in findings if x.no_more_workers), None) or \
        next((x for x in findings if x.leads), None) or next(iter(findings), None)


def headline(text: str, findings: tuple[Finding, ...], f: Any) -> str:
    """The verdict's sentence with the findings: one that rules out more workers replaces
    the verdict's reasoning (add workers); one that `leads` opens it; the others follow."""
    if (first := next((x for x in findings if x.no_more_workers), None) or
            next((x for x in findings if x.leads), None)) is not None:
        share = getattr(f, "data_wait_share", math.nan)
        wait = "" if not isinstance(share, float) or math.isnan(share) else (
            f" The device waits for data {by_the_line(share, near=BY_THE_LINE)} of step time.")
        kept = [] if first.no_more_workers else [text]
        rest = [_sentence(x.text) for x in findings if x is not first]
        return " ".join([_sentence(first.text) + wait, *kept, *rest])
    return " ".join([text, *(_sentence(x.text) for x in findings)])


def _sentence(text: str) -> str:
    """A finding's text as a sentence: capitalised, ended."""
    text = text[0].upper() + text[1:] if text else text
    return text if text.endswith((".", "!", "?")) else text + "."


def with_findings(dg: Diagnosis, found: tuple[Finding, ...], f: Any,
                  workers_now: int) -> Diagnosis:
    """The window's verdict with its findings: their headline, their fixes first (merge),
    the bound's text without a prediction whose advice they dropped, the cause named."""
    if not found:
        return dg
    advice = merge(dg.advice, found, workers_now)
    bound, first = dg.bound, next(iter(dg.advice), None)
    if first is not None and first.param == "num_workers" and first not in advice:
        bound = without_prediction(bound)
    return dataclasses.replace(dg, headline=headline(dg.headline, found, f), advice=advice,
                               bound=bound, cause=lead(found).cause)


def merge(advice: tuple[Advice, ...], findings: tuple[Finding, ...],
          workers_now: int) -> tuple[Advice, ...]:
    """The findings' fixes first; no num_workers increase beside a finding that says more
    workers will not help, and no num_workers change at all beside one whose cause is in
    the figures the prediction is made from (`workers_unpredictable`)."""
    if not findings:
        return advice
    blocked = any(f.no_more_workers for f in findings)
    more = blocked and any(a.param == "num_workers" and isinstance(a.value, int)
                           and a.value > workers_now for a in advice)
    unpredictable = any(f.workers_unpredictable for f in findings)
    kept = tuple(a for a in advice if not (
        unpredictable and a.param == "num_workers" and a.value != workers_now
        or more and (
            a.param == "num_workers" and isinstance(a.value, int) and a.value > workers_now
            # kept alive between epochs: the workers advised from none, dropped with them
            or a.param == "persistent_workers" and workers_now == 0)))
    first: list[Advice] = []
    led = lead(findings)  # the verdict's cause: its fix first
    for a in (a for f in sorted(findings, key=lambda f: f is not led) for a in f.advice):
        if a not in first:
            first.append(a)
    said = {(a.param, str(a.value)) for a in first}  # a setting the findings advise already
    return tuple(first) + tuple(a for a in kept if (a.param, str(a.value)) not in said)
