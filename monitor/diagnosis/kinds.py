"""Advice in the terms of the loader the script has. A torch DataLoader's settings are the
LoaderConfig fields; a torchdata.nodes pipeline (monitor/probe/loaders.py nodes_settings)
has its own: a ParallelMapper's num_workers and method, a Prefetcher's depth, a PinMemory
node, and no persistent workers at all. The bound model (monitor/diagnosis/bound.py) was
measured for worker processes: a thread mapper's workers share the GIL, so their count's
gain is not predicted until a run measures it (torchdata.nodes "0 -> 1 worker: +79%"
measured -43% and -60% bare)."""
from __future__ import annotations

import dataclasses
from typing import Any

from monitor.diagnosis.finding import Advice, Diagnosis

NODES = "torchdata.nodes"
NODE_OF = {"num_workers": "ParallelMapper(num_workers={v})",
           "prefetch_factor": "Prefetcher(prefetch_factor={v})",
           "pin_memory": "a PinMemory node at the end of the pipeline",
           "drop_last": "Batcher(drop_last={v})"}


# NOTE [one iterator for every epoch]
# persistent_workers in a nodes pipeline's terms: each iter(loader) resets the pipeline, and
# a ParallelMapper's reset stops its worker processes and starts new ones (torchdata 0.11,
# nodes/map.py); one iterator kept over every epoch starts them once. Bare, 2 process
# workers, spawn, a 40 MB map function, 8 epochs of 20 batches: 14.47 s with an iter() an
# epoch, 2.48 s with one (fork: 1.95 and 1.29 s); monitored, the epoch-a-iter() run's
# steady state 93-97 samples/s, predicted 1,037 with one iterator, measured 978-1,028 (fork:
# 605, predicted 1,197, measured 986).
ONE_PASS = "one iterator for every epoch"
ONE_PASS_HOW = ("iter(loader) once over a sampler that yields each epoch's order in turn "
                "(or the source under torchdata's Cycler, where the release has it), each "
                "epoch's batches taken from it with itertools.islice(it, batches_per_epoch): "
                "the ParallelMapper's workers start once, where every iter(loader) starts "
                "them again")


def _in_nodes(a: Advice, method: str | None) -> Advice | None:
    """One advice in a nodes pipeline's terms; None where it has no such setting."""
    if a.param == "persistent_workers" and a.value is True and method == "process":
        return dataclasses.replace(a, param="dataset", value=ONE_PASS,
                                   reason=f"{ONE_PASS_HOW}; it {a.reason}")
    if a.param not in NODE_OF and a.param not in ("dataset", "host", "model"):
        return None  # persistent_workers for threads, in_order on a loader: not this API's
    if a.param not in NODE_OF:
        return a
    where = NODE_OF[a.param].format(v=a.value)
    if a.param == "num_workers" and method == "thread":
        return dataclasses.replace(
            a, predicted_throughput=None, predicted_low=None, predicted_high=None,
            base_throughput=None,
            uncertain=True, reason=f"{where} with method='thread': its workers share the "
            "GIL, so the gain is not predicted (the model is measured for processes); "
            "method='process' or a run at this setting measures it")
    return dataclasses.replace(a, reason=f"{where}: {a.reason}")


def in_loader_terms(dg: Diagnosis, config: dict[str, Any]) -> Diagnosis:
    """The diagnosis with its advice in the terms of the loader `config` describes."""
    if config.get("loader_kind") != NODES or not dg.advice:
        return dg
    method = config.get("worker_method") or "thread"
    kept = tuple(x for x in (_in_nodes(a, method) for a in dg.advice) if x is not None)
    return dataclasses.replace(dg, advice=kept)
