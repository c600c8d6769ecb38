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


def _in_nodes(a: Advice, method: str | None) -> Advice | None:
    """One advice in a nodes pipeline's terms; None where it has no such setting."""
    if a.param not in NODE_OF and a.param not in ("dataset", "host", "model"):
        return None  # persistent_workers, in_order on a loader, ...: not this API's
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
