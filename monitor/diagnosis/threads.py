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
# CPU and the device waiting for data, is named with the fix: one thread a worker
# (worker_init_fn), torch.set_num_threads(cores - workers) in the main process. The gain is
# measured, not predicted (tests/scripts/causes.py threads, bare before and after).
from __future__ import annotations

from typing import Any

from monitor.diagnosis.finding import Advice, Finding
from monitor.thresholds import (
    CPU_SATURATED,
    RUNQ_CONTENTION_SHARE,
    STARVING_SHARE,
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
    if nw < 1 or not f.starved_share >= STARVING_SHARE or not (
            waits >= RUNQ_CONTENTION_SHARE or busy >= CPU_SATURATED):
        return None
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
                     "before the script starts")
        return Finding(WORKER_THREADS, text, {"threads_a_worker": each, "workers": nw,
                                              "runq_share": waits}, (fix,),
                       no_more_workers=True)
    main = f.main_busy_threads
    if main is not None and main >= THREADS_AT_WORK and main + nw > cores and \
            (f.workers_cpu_cores or 0.0) >= 0.5 * min(nw, cores):
        keep = max(1, cores - nw)
        text = (f"the main process keeps {main:.1f} threads at work (torch's intra-op pool: "
                f"one a core by default) beside {nw} busy workers on {cores} usable cores: "
                f"they take the workers' CPU, and the loaders wait {waits:.0%} of their time "
                "for one")
        fix = Advice("host", f"torch.set_num_threads({keep})", None,
                     f"in the training script, before the loop: torch.set_num_threads({keep}) "
                     "leaves the workers their cores; the step's own operators lose less "
                     "than the loaders gain while the loop waits for data")
        return Finding(MAIN_THREADS, text, {"main_threads": main, "workers": nw,
                                            "runq_share": waits, "threads_kept": keep},
                       (fix,), leads=True)
    return None
