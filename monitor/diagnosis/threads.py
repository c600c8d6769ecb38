"""Threads that fight the loaders for the cores (NOTE [threads at work]). Pure: a window's
Features in, a finding out."""

# NOTE [threads at work]
# A loader needs one thread at work. A library's own pool in every worker (OpenCV's, an
# OpenBLAS or OpenMP pool, a tokenizer's) puts pool x num_workers threads on the cores (12
# workers x 16 OpenCV threads = 192: homr PR #128; up to 10x from capping them:
# transferable-samplers PR #12); the main process's intra-op pool (torch's: one thread a
# core by default) takes the cores from busy workers. The sampler counts, each pass, the
# threads of each process that wanted a CPU at least a fifth of it (procfs
# busy_threads_since: on one, or waiting for one); over the window a worker's mean above
# THREADS_AT_WORK, or the main process's beside busy workers, with the loaders waiting for a
# CPU and the device waiting for data (not fed: Features.fed, the verdict's own line, so a
# run judged fed by the line, alone or as an identical run was, has no cause its twin
# lacks), is named with the fix: one thread a worker
# (worker_init_fn), torch.set_num_threads(cores - workers) in the main process. A pool in
# every worker has no predicted gain: threads that wait for each other spin, so neither the
# loaders' CPU wait (4%) nor their CPU use says what one thread a worker gives (x4-18 bare
# in four pairs, x14-30 in earlier ones: tests/scripts/causes.py threads; the advice says
# so). The main process's pool has one: with the cores shared alike among the threads at
# work, the workers get cores / (main + workers) of a core each before and cores / (kept +
# workers) after, at most all of the time they waited for a CPU back, and the loop at most
# its compute-bound rate (main_threads: x1.33 predicted, x1.45 bare). Beside other
# processes' busy threads (a shared workstation, another job on the node) the same pool
# stalls the step itself: its threads want more CPU than is left, and each operator waits
# for its slowest thread (tests/scripts/causes.py main_threads beside one busy process: 48
# samples/s, 243 with torch.set_num_threads(1); recompiles.py 85-128 against 1,455-1,480).
# The main process's threads at work are then named against the cores the others leave,
# whether the loop waits for data or not; that gain has no prediction (the stall is the
# threads' wait for each other, which no CPU figure shows). Where the workers keep ahead of
# the loop (most of its wait on batches already made: NOTE [the loop's receive] in
# costs.py), the loop's own thread is what waits for a CPU among the pool's as it receives
# them: the pool is named, not the receive (main_threads: 456/463 -> 622/624 samples/s
# bare with one thread, x1.33 predicted; beside other processes' busy threads x2.0-2.8
# bare, no prediction). Either pool's spinning is in the CPU figures the bound model
# predicts other num_workers from (0 workers beside it and other processes: predicted x1.6,
# measured x0.5), so no num_workers change is advised beside it (workers_unpredictable).
from __future__ import annotations

import math
from typing import Any

from monitor.diagnosis.costs import RECEIVE
from monitor.diagnosis.finding import Advice, Finding
from monitor.diagnosis.loading import held, made_ahead
from monitor.thresholds import (
    CPU_SATURATED,
    MAIN_CPU_GOT,
    OTHERS_BUSY_CORES,
    RECEIVE_HELD_SHARE,
    RUNQ_CONTENTION_SHARE,
    THREADS_AT_WORK,
)

WORKER_THREADS, MAIN_THREADS = "worker-threads", "main-threads"


def threads_fight(f: Any) -> Finding | None:
    nw, cores = f.num_workers, f.usable_cores
    waits = f.loaders_runq_share or 0.0
    busy = f.cpu_busy_fraction or 0.0
    # the cores full, or the loaders waiting for one: a pool's threads spin on a CPU (an
    # OpenMP pool waits on one: 2 workers x 2 threads, 2 cores, the loaders waited 3% and
    # ran 14-30x slower than with one thread each)
    if nw < 1 or f.fed or not (
            waits >= RUNQ_CONTENTION_SHARE or busy >= CPU_SATURATED):
        return beside_others(f)
    # the loop's wait on batches its workers made ahead (NOTE [the loop's receive]): the
    # main process is the one short of CPU, its own pool among what takes it
    ahead = made_ahead(getattr(f, "receive_wait_share", None))
    each = f.worker_busy_threads
    if each is not None and each >= THREADS_AT_WORK and nw * each > cores:
        text = (f"each of the {nw} workers keeps {each:.1f} threads at work at once (a "
                "library's own pool: OpenCV, OpenBLAS/OpenMP, a tokenizer): "
                f"{nw * each:.0f} threads want the {cores} usable cores ({busy:.0%} busy; the "
                f"loaders wait {waits:.0%} of their time for a CPU): a pool's threads that "
                "wait for each other spin on the cores the other workers need")
        fix = Advice("dataset", "one thread a worker", None,
                     "cap each worker's pool in worker_init_fn: torch.set_num_threads(1), "
                     "cv2.setNumThreads(0), threadpoolctl.threadpool_limits(1); or "
                     "OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 in the environment "
                     "before the script starts (the gain is not predicted: no CPU figure "
                     "says how much of the pools' CPU is spent waiting for each other; "
                     "measured x4-18 on a reproducer, 2 workers of 2 threads on 2 cores)")
        return Finding(WORKER_THREADS, text, {"threads_a_worker": each, "workers": nw,
                                              "runq_share": waits}, (fix,),
                       no_more_workers=True, workers_unpredictable=True)
    main = f.main_busy_threads
    # the workers want a CPU at least half their time (on one, or waiting for one: the
    # pool's threads take the CPU they would use, so their use alone reads low: 0.45 a core
    # each, waiting 41% of their time, beside 2 main threads on 2 cores)
    wanted = (f.loading_cpu_per_wall or 0.0) + waits
    if main is not None and main >= THREADS_AT_WORK and main + nw > cores and (
            wanted >= 0.5 or ahead):
        keep = max(1, cores - nw)
        # the cores shared alike among the threads at work: the loaders (or, ahead, the
        # loop's own thread receiving) get (main + nw) / (keep + nw) more, at most all of
        # their wait for a CPU back, and the loop at most all of its data wait
        faster = min((main + nw) / (keep + nw), 1 / max(1e-9, 1 - f.starved_share),
                     math.inf if ahead else 1 / max(1e-9, 1 - waits))
        rate = f.throughput
        pred = rate * faster if rate == rate and rate > 0 and faster > 1 else None
        if ahead:
            # beside other processes' busy threads each operator also waits for its slowest
            # thread: a stall no CPU figure shows (x2.0-2.8 bare against x1.2 so predicted)
            others = (f.other_cpu_cores or 0.0) >= OTHERS_BUSY_CORES
            # where the loop's thread was through that wait, measured (NOTE [the loop's
            # receive]): blocked, the workers' own threads hand each batch over late
            blocked = held(f) or 0.0
            late = blocked >= RECEIVE_HELD_SHARE
            return _main_pool(
                main, keep, None if others else pred, f"beside {nw} busy workers on {cores} "
                f"usable cores: the workers keep ahead ({f.receive_wait_share:.0%} of the "
                "data wait was on batches already made), and " + (
                    f"the loop's thread spends {blocked:.0%} of that wait blocked on their "
                    "hand-off of each batch, which their own threads make while the pool holds "
                    "the cores" if late else
                    "the loop's own thread, receiving them, waits for a CPU among them"),
                ("gives the workers' threads that hand each batch over the cores the pool "
                 "took" if late else "gives the loop's thread its core back while it receives "
                 "each batch") + "; more workers only queue more" + (
                    " (the gain is not predicted beside other processes' busy threads, "
                    "where each operator also waits for its slowest thread: measured x2.0-2.8 "
                    "on a reproducer)" if others else ""),
                {"workers": nw, "ahead_share": f.receive_wait_share}, leads=True,
                no_more_workers=True, supersedes=(RECEIVE,))
        return _main_pool(
            main, keep, pred, f"beside {nw} busy workers on {cores} usable cores: they take "
            f"the workers' CPU, and the loaders wait {waits:.0%} of their time for one",
            "leaves the workers their cores; the step's own operators lose less than the "
            "loaders gain while the loop waits for data",
            {"workers": nw, "runq_share": waits}, leads=True)
    return beside_others(f)


def beside_others(f: Any) -> Finding | None:
    """The main process's pool beside other processes' busy threads (NOTE [threads at
    work]): its threads at work want more cores than the others leave, and get under
    MAIN_CPU_GOT of what they want."""
    main, cores = f.main_busy_threads, f.usable_cores
    others, got = f.other_cpu_cores, f.main_cpu_cores
    if main is None or main < THREADS_AT_WORK or others is None or got is None or \
            others < OTHERS_BUSY_CORES:
        return None
    left = max(0.0, cores - others - (f.workers_cpu_cores or 0.0))
    if main <= left or got >= MAIN_CPU_GOT * main:
        return None
    keep = max(1, math.floor(left + 0.25))
    ranks = getattr(f, "local_ranks", None) or 1
    who = "other processes" if ranks <= 1 else (
        f"other processes (this job's {ranks - 1} other rank{'s' if ranks > 2 else ''} here "
        "among them)")
    return _main_pool(
        main, keep, None, f"while {who} take {others:.1f} of the {cores} usable "
        f"cores: its threads get {got:.2f} of a core together, and each operator waits for "
        "its slowest thread", "(the cores the other processes leave; the gain is not "
        "predicted: measured x5 on a reproducer beside one busy process)",
        {"others_cores": others, "main_cpu_cores": got}, leads=f.accelerator == "cpu")


def _main_pool(main: float, keep: int, pred: float | None, beside: str, why: str,
               numbers: dict[str, Any], leads: bool, no_more_workers: bool = False,
               supersedes: tuple[str, ...] = ()) -> Finding:
    """The main process's pool named, `beside` what, with torch.set_num_threads(keep)."""
    text = (f"the main process keeps {main:.1f} threads at work (torch's intra-op pool: one a "
            f"core by default) {beside}")
    fix = Advice("host", f"torch.set_num_threads({keep})", pred,
                 f"in the training script, before the loop: torch.set_num_threads({keep}) "
                 + why)
    return Finding(MAIN_THREADS, text, {"main_threads": main, "threads_kept": keep,
                                        **numbers}, (fix,), leads=leads,
                   no_more_workers=no_more_workers, workers_unpredictable=True,
                   supersedes=supersedes)
