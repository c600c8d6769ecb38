"""Causes that are a cost of the loader itself, not of the data: per-sample overhead (big
batches fetched one sample at a time), worker start-up (workers started again at every
epoch), the loop's own receiving of each batch (workers ahead of it: NOTE [the loop's
receive]) and workers whose hand-off costs more than they save (more of them measured slower
in the run's own history), each with its numbers and fix (monitor/diagnosis/causes.py gathers
them with the rest). Pure: the window's steps, the probe's `loader` report and the run's
generations (monitor/assess/history.py) in."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from monitor.diagnosis.finding import Advice, Finding
from monitor.diagnosis.loading import held, made_ahead
from monitor.frames.analysis import data_wait_share, epoch_stalls, loop_rate
from monitor.records import LIGHTNING_FIT
from monitor.thresholds import (
    EPOCH_STALL_SHARE,
    HISTORY_MIN_STEPS,
    PER_SAMPLE_MAX_S,
    PER_SAMPLE_MIN_BATCH,
    PER_SAMPLE_WAIT_SHARE,
    RECEIVE_HELD_SHARE,
    SLOWER_SHARE,
    STARTUP_MIN_S,
    STARTUP_STEPS_X,
)

PER_SAMPLE, STARTUP, SLOWER = "per-sample-overhead", "worker-startup", "more-workers-slower"
ONE_LOADER = "one DataLoader for every epoch"  # the fix for a loader built each epoch
RECEIVE = "loop-receive"


def per_sample(steps: pd.DataFrame, report: dict[str, Any] | None,
               cpu_wait_share: float | None = None) -> Finding | None:
    """Batches of many samples, each costing the loop a few µs, fetched one by one: the
    per-sample call and collate are the whole cost. `cpu_wait_share`: the loaders' time
    spent runnable, waiting for a CPU (schedstat): beside other jobs a sample's wall time
    is mostly that wait (84% of it on a saturated box: 4.6 µs of CPU read as 29 µs), so the
    cost judged is the share on a CPU."""
    if steps.empty or not report or report.get("batched_fetch") is not False or \
            len(steps) < 10:
        return None
    batch = float(steps["samples"].median())
    samples, wait = float(steps["samples"].sum()), float(steps["wait_s"].sum())
    share = data_wait_share(steps)
    if batch < PER_SAMPLE_MIN_BATCH or samples <= 0 or not share >= PER_SAMPLE_WAIT_SHARE:
        return None
    per = wait / samples
    on_cpu = per * (1.0 - min(max(cpu_wait_share or 0.0, 0.0), 1.0))
    if on_cpu > PER_SAMPLE_MAX_S:
        return None
    nw = int(report.get("num_workers") or 0)
    size = float(report.get("batch_bytes") or 0) / batch
    # all of the wait gone: the bound model's own ceiling (monitor/diagnosis/bound.py: a
    # batch per median compute), the most any workers it advises can reach too (a sum of
    # compute with a few preempted steps in it read below their prediction once)
    up_to = batch / max(float(steps["compute_s"].median()), 1e-9)
    now = loop_rate(steps)
    # workers share that cost out (measured bare: 0 -> 2 workers read -15% to +95%, box
    # by box), the batched fetch removes it (4-8 times either): the fix first, workers after
    where = "in the main process" if nw == 0 else f"in each of {nw} workers"
    waited = f" ({on_cpu * 1e6:,.1f} µs of it on a CPU, the rest waiting for one)" \
        if on_cpu < 0.8 * per else ""
    text = (f"per-sample overhead: the loop waits {per * 1e6:,.1f} µs a sample{waited}, "
            f"fetched and collated one at a time in batches of {batch:,.0f} ({size:,.0f} B a "
            f"sample) {where}; Python's call per sample, not the data, is the cost.")
    kind = "yield whole batches from the IterableDataset and pass batch_size=None" \
        if report.get("iterable") else ("give the dataset __getitems__(indices) returning "
                                        "the batch at once (a tensor, array or Arrow table "
                                        "indexed by the whole list), or pass a BatchSampler "
                                        "as sampler= with batch_size=None")
    fix = (f"fetch the batch at once: {kind}; up to {(up_to / now - 1) * 100:+.0f}% "
           f"({up_to:,.0f} samples/s) if the fetch then costs nothing")
    return Finding(PER_SAMPLE, text, {"per_sample_s": on_cpu, "wall_per_sample_s": per,
                                      "batch": batch,
                                      "bytes_per_sample": size, "up_to": up_to},
                   (Advice("dataset", "batched fetch", up_to, fix),), leads=True)


def startup(steps: pd.DataFrame, report: dict[str, Any] | None,
            throughput: float) -> Finding | None:
    """Workers started again at each epoch, and what that start is made of."""
    r = report or {}
    nw, first = int(r.get("num_workers") or 0), r.get("first_batch_s")
    # a DataLoader built again each epoch starts its workers whatever its settings say
    # (NOTE [a loader built each epoch] in monitor/probe/choice.py)
    again = bool(r.get("built_again"))
    lightning = r.get("built_by") == LIGHTNING_FIT
    builder = "Lightning" if lightning else "the script"
    if nw == 0 or (r.get("persistent_workers") and not again) or first is None or \
            steps.empty or "epoch" not in steps.columns or steps["epoch"].nunique() < 2:
        return None  # one epoch: its workers started once, as persistent ones would
    step = float((steps["wait_s"] + steps["compute_s"]).median())
    n, lost, _, _ = epoch_stalls(steps, first_over_s=STARTUP_STEPS_X * max(step, 1e-6))
    loop = float((steps["wait_s"] + steps["compute_s"]).sum())
    if first < max(STARTUP_MIN_S, STARTUP_STEPS_X * step) and not (
            again and loop > 0 and lost / loop >= EPOCH_STALL_SHARE):
        return None  # (a loader built again: its stalls, where the epoch-stall verdict,
        # which reads the settings, does not see them)
    method, iter_s = r.get("start_method") or "fork", float(r.get("iter_s") or 0.0)
    pickled = r.get("dataset_pickled_bytes")
    # a torchdata.nodes pipeline: its ParallelMapper's processes, sent its map function
    nodes = r.get("loader_kind") == "torchdata.nodes"
    obj = "map function's object" if nodes else "dataset object"
    parts = [f"each epoch starts its {nw} workers again (start method {method}, " + (
        "a torchdata.nodes ParallelMapper's, started at each iter(loader)" if nodes else
        f"{builder} builds a new DataLoader each epoch, and persistent_workers keeps a "
        "loader's workers, not a new loader's" if again else "persistent_workers off") +
        f"): the first batch came {first:.2f} s after iter()"]
    if method in ("spawn", "forkserver"):
        size = f" ({pickled / 1e6:,.1f} MB pickled)" if pickled else ""
        parts.append(f"iter() itself took {iter_s:.2f} s: {method} starts the workers in "
                     f"turn, each a new interpreter that imports torch and unpickles the "
                     f"{obj}{size}")
    ready = r.get("ready_s") or []
    if ready:
        parts.append("the workers' first batches came at " + ", ".join(
            f"{t:.2f}" for t in ready) + " s")
    pred = float(steps["samples"].sum()) / (loop - lost) if n and loop > lost > 0 else None
    gain = f": {lost:.1f} s of this window back, {(pred / throughput - 1) * 100:+.0f}%" \
        if pred and throughput > 0 else ""
    advice = [Advice("persistent_workers", True, pred, "keeps the workers between epochs, "
                     f"so their start-up is paid once{gain}")]
    if again:
        how = ("Trainer(reload_dataloaders_every_n_epochs=0), so that Lightning builds the "
               "training loader once" if lightning else "build the DataLoader once, before "
               "the epoch loop")
        advice = [Advice("dataset", ONE_LOADER, pred, f"{how}, with persistent_workers=True: "
                         f"its workers then start once, where each new loader starts its "
                         f"own{gain}")]
        if not r.get("persistent_workers"):
            advice.append(Advice("persistent_workers", True, None, f"with {ONE_LOADER} "
                                 "(alone it keeps nothing: each epoch's loader is new)"))
    if method in ("spawn", "forkserver") and pickled and pickled > 10e6:
        where = ("the map function's object and open the data in the worker (lazily, at "
                 "its first call)") if nodes else ("the dataset and open the data in the "
                                                  "worker (lazily in __getitem__, or in "
                                                  "worker_init_fn)")
        advice.append(Advice("dataset", f"a small {obj}", None, f"hold paths or offsets in "
                             f"{where}: every worker receives the whole object, "
                             f"{pickled / 1e6:,.0f} MB, pickled"))
    return Finding(STARTUP, "; ".join(parts) + ".",
                   {"first_batch_s": first, "iter_s": iter_s, "ready_s": list(ready),
                    "start_method": method, "pickled_bytes": pickled, "epoch_starts": n,
                    "lost_s": lost}, tuple(advice))


def slower_with_more(history: Sequence[dict[str, Any]], workers_now: int,
                     throughput: float) -> Finding | None:
    """The run itself measured more with fewer workers than it has now: their hand-off (a
    pickle, a copy and a queue per batch) costs the loop more than their fetching saves."""
    tried = [g for g in history if g.get("throughput") and g["steps"] >= HISTORY_MIN_STEPS
             and int(g["settings"].get("num_workers") or 0) < workers_now]
    if not tried or not throughput > 0:
        return None
    best = max(tried, key=lambda g: g["throughput"])
    fast = float(best["throughput"])
    if fast < throughput * (1 + SLOWER_SHARE):
        return None
    nw = int(best["settings"].get("num_workers") or 0)
    text = (f"more workers made it slower: this run measured {fast:,.0f} samples/s with "
            f"{nw} worker{'s' if nw != 1 else ''} and {throughput:,.0f} with {workers_now} "
            f"now ({throughput / fast - 1:+.0%}); each batch a worker makes is pickled, "
            "copied and unpickled by the loop, and that hand-off costs more than the fetch "
            "they take over (small samples, or few cores).")
    fix = (f"back to num_workers={nw}: {fast:,.0f} samples/s measured in this run, "
           f"{(fast / throughput - 1) * 100:+.0f}%")
    return Finding(SLOWER, text, {"best_workers": nw, "best_throughput": fast,
                                  "workers": workers_now, "throughput": throughput,
                                  "best_steps": int(best["steps"])},
                   (Advice("num_workers", nw, fast, fix),), no_more_workers=True)


# NOTE [the loop's receive]
# A batch a worker made reaches the loop through a queue: the loop unpickles it and, with
# torch's default sharing strategy (file_descriptor), fetches each tensor's shared memory as
# a descriptor from the worker's sharer thread, a round trip a tensor. Where that is the
# wait, the workers are ahead of the loop: as it asks for its batch, a finished one is
# already queued (the steps' `ready`, counted by monitor/probe/workers.py at the ask: at
# the receipt, 2 workers in step put a second batch behind the first while the loop waited
# for both, and a remote-read loader's wait read 47% made ahead, 1% at the ask), where a
# loop that waits for its workers finds none, and a slow sample holding the in-order queue
# has later batches held (`held`). When most of the data wait is on such steps (AHEAD_SHARE:
# monitor/diagnosis/loading.py receive), the workers' idle time is waiting for work, not
# storage or a lock (loading.py gives them no wall time), the bound model takes that wait a
# step as the loop's own overhead (bound.py, o), and more workers only queue more. Bare on
# the 2-core box (tests/scripts/causes.py fields: 16 samples of 20 tensors a batch, a 5 ms
# step), samples/s: 2 workers 1,364, 4 workers 1,408, file_system sharing 2,288, one tensor
# a sample 2,492; beside another session's two busy processes and a toggling one: 663 and
# 454, 601 and 704, 1,248 and 1,043, 2,311 and 2,164. The monitor had named the workers
# blocked on "a sleep, a lock, a remote call" and advised 2 -> 4 at +83%. With one tensor
# a batch (the cpu samples of bench/repro/loader.py, 2 workers, a plain script of the same
# loop) file_system sharing measured +13% quiet and -8% beside those neighbours: not
# advised there.
# A batch queued is not yet handed over: the worker's own threads send it (the queue's
# feeder writes its bytes, the sharer thread answers for each descriptor), and a worker busy
# making its next samples answers late (its CPU, its GIL). So the probe reads the loop
# thread's CPU and its wait for a CPU through each receipt (monitor/probe/thread_clock.py),
# and the finding says where the receiving went: the loop's own work, the cores, or the
# workers' hand-off. 20 small tensors a sample, cheap ones: on a CPU 39-63% of the wait,
# blocked 4-40%. 2 persistent workers of 0.4 ms of Python a sample, 2 tensors a batch, a
# small step on the CPU: on a CPU 15-17%, blocked 51-67%; file_system sharing, which ends the
# sharer's round trips, measured +13-15% there (8 epochs bare, 3.51-3.61 s against
# 3.96-4.17 s; 2 epochs, 1 s, had read it as none), 3 and 4 workers no gain.
def loop_receive(report: dict[str, Any] | None, f: Any) -> Finding | None:
    """The loop waits for batches its workers already made: receiving them is the wait."""
    r = report or {}
    nw = int(r.get("num_workers") or 0)
    ahead = getattr(f, "receive_wait_share", None)
    if nw == 0 or not made_ahead(ahead) or not f.receive_wait_s or f.fed:
        return None  # (fed: the verdict's own line, its noise included)
    wait, step = f.receive_wait_s, f.compute_per_step_s
    batch = f.throughput * f.window_s / max(f.steps, 1)
    tensors = int(r.get("batch_tensors") or 0)
    fds = r.get("sharing_strategy") == "file_descriptor" and tensors > 0
    each = "its one tensor" if tensors == 1 else f"each of its {tensors} tensors"
    how = (f", fetching the shared memory of {each} from the worker as a file descriptor"
           if fds else "")
    up_to = batch / max(step, 1e-9)
    them = f"{nw} workers keep" if nw != 1 else "one worker keeps"
    on, runq = getattr(f, "receive_cpu_share", None), getattr(f, "receive_runq_share", None)
    blocked = held(f)
    where = f"; its thread on a CPU {on:.0%} of that time" if on is not None else ""
    if blocked is not None:
        where += (f", waiting for one {runq:.0%}, and {blocked:.0%} waiting on the worker "
                  "to hand it over")
        if blocked >= RECEIVE_HELD_SHARE:
            where += (", whose own threads send each batch and answer for each tensor's "
                      "descriptor while it makes its next samples")
    text = (f"the loop's own receiving is the wait: its {them} ahead ({ahead:.0%} of the "
            "data wait was on batches asked for with a finished one already queued), and "
            f"the loop takes {wait * 1e3:.1f} ms to receive each (unpickling "
            f"it{how}{where}); more workers only queue more batches.")
    advice = []
    if fds and tensors > 1:  # (one tensor a batch: -8% and +13% bare, beside others and not)
        advice.append(Advice(
            "dataset", "file_system sharing", None, "torch.multiprocessing."
            "set_sharing_strategy('file_system') at the script's start: each tensor's memory "
            f"is then found by its name, with no round trip to the worker for each of the "
            f"{tensors} tensors a batch"))
    if tensors > 1:
        advice.append(Advice(
            "dataset", "fewer tensors a batch", None, f"{tensors} tensors a batch are received "
            "one by one: return a sample's fields as one tensor (stacked, or one array) and "
            "split them after the batch arrives"))
    if f.accelerator == "cuda" and not f.config.get("pin_memory"):
        advice.append(Advice("pin_memory", True, None, "the loader's pin-memory thread then "
                             "receives each batch, not the loop's own thread"))
    advice.append(Advice(
        "dataset", "a larger batch", None, "the receiving is paid once a batch, whatever its "
        "size, so a larger one spreads it where the training allows; all of the wait back "
        f"would be up to {(up_to / f.throughput - 1) * 100:+.0f}% ({up_to:,.0f} samples/s) "
        "at this batch size"))
    return Finding(RECEIVE, text, {"workers": nw, "wait_share": ahead, "receive_s": wait,
                                   "cpu_share": on, "runq_share": runq,
                                   "tensors": tensors, "sharing_strategy":
                                   r.get("sharing_strategy"), "up_to": up_to},
                   tuple(advice), no_more_workers=True)
