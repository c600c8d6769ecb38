"""Mid-epoch loader changes for the attach probe: when the user allows them (`monitor run
--autotune-every-steps N`), a requested loader change applies at a step boundary instead of
waiting for the epoch's end.

A mid-epoch change rebuilds the DataLoader's iterator over the batches the epoch has not
yet delivered, so the training loop sees every batch of the epoch once, in the same order.
That needs the epoch's order fixed in advance: at iter(loader) the loader's own batch
sampler is drawn once (its randomness is the epoch's, as it would have been) into an
EpochPlan, which the iterator is built from and which can start again at any position. It
is possible only for a map-style dataset with a batch sampler; an IterableDataset has no
position to resume from (its stream would restart or skip), and batch_size=None has no
batch sampler: those wait for the epoch, and say so once. The new workers draw new random
seeds, as at any epoch start.

Only the standard library is imported here (the user's environment).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monitor.probe.timing import TimedIterator

EVERY_ENV = "STARVATION_MONITOR_EVERY_STEPS"
CHECK_S = 0.5  # how often, between two steps, pending requests are read mid-epoch


def every_steps() -> int | None:
    """N from the environment `monitor run --autotune-every-steps N` sets (None: off)."""
    try:
        n = int(os.environ.get(EVERY_ENV) or 0)
    except ValueError:
        return None
    return n if n > 0 else None


def why_not_resumable(loader: Any, inner: Any = None) -> str | None:
    """Why this loader's epoch cannot be resumed at a step (None: it can); `inner`, its
    iterator now, when the question is about this step."""
    data = sys.modules.get("torch.utils.data")
    iterable = getattr(data, "IterableDataset", None)
    if iterable is not None and isinstance(getattr(loader, "dataset", None), iterable):
        return ("its dataset is an IterableDataset: a stream has no position to resume "
                "from, so a change waits for the next epoch")
    if getattr(loader, "batch_sampler", None) is None:
        return ("it has no batch sampler (batch_size=None): a change waits for the next "
                "epoch")
    if getattr(inner, "_in_order", True) is False:
        return ("its workers hand batches over as they finish (in_order=False): the "
                "batches delivered are not the plan's first ones, so a change waits for the "
                "next epoch")
    return None


class EpochPlan:
    """One epoch's batches of indices, drawn once from the loader's batch sampler, served
    from `start` on (the batches already delivered are skipped)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches, self.start = batches, 0

    def __iter__(self) -> Any:
        return iter(self.batches[self.start:])

    def __len__(self) -> int:
        return len(self.batches) - self.start


def build(loader: Any, orig_iter: Any, plan: EpochPlan | None) -> Any:
    """The loader's iterator, over `plan` when there is one (its own sampler untouched)."""
    if plan is None:
        return orig_iter(loader)
    own = loader.batch_sampler
    # DataLoader refuses to set batch_sampler after __init__; the iterator reads it once,
    # when built, and it is put back at once. A persistent iterator is not built again:
    # __iter__ resets it, and its reset draws from the index sampler it holds, so that one
    # gets the plan for the reset and its own sampler back after (else every later epoch
    # would replay this plan: one order, and the batches before `start` lost).
    held = getattr(loader, "_iterator", None)
    if held is not None and hasattr(held, "_index_sampler"):
        held._index_sampler = plan
    object.__setattr__(loader, "batch_sampler", plan)
    it = None
    try:
        it = orig_iter(loader)
    finally:
        object.__setattr__(loader, "batch_sampler", own)
        # the epoch's order is drawn; each iterator's length is the whole epoch's again
        for x in (held, getattr(loader, "_iterator", None), it):
            if getattr(x, "_index_sampler", None) is plan:
                x._index_sampler = loader._index_sampler
    return it


class MidEpoch:
    """The attach probe's between-steps hook under `--autotune-every-steps`: every CHECK_S
    it lets `apply_pending(loader, at_step)` apply a pending change; when the settings
    changed, the old iterator's workers stop and the epoch goes on from the next undelivered
    batch under the new settings."""

    def __init__(self, loader: Any, orig_iter: Any,
                 apply_pending: Callable[[Any, int], bool], t_start: float,
                 clock: Callable[[], float] = time.perf_counter,
                 resumable: Callable[[Any, Any], bool] = lambda loader, inner: True) -> None:
        self.loader, self.orig, self.apply_pending, self.clock, self.resumable = \
            loader, orig_iter, apply_pending, clock, resumable
        self.plan = EpochPlan(list(loader.batch_sampler))
        self.checked = t_start

    def make_iter(self) -> Any:
        return build(self.loader, self.orig, self.plan)

    def __call__(self, it: TimedIterator) -> bool:
        now = self.clock()
        if now - self.checked < CHECK_S:
            return False
        self.checked = now
        old = it.inner
        if not self.resumable(self.loader, old):  # its pending change waits for the epoch
            return False
        if not self.apply_pending(self.loader, it.delivered):
            return False
        getattr(old, "_shutdown_workers", lambda: None)()
        self.plan.start = it.delivered
        it.replace(self.make_iter())
        return False
