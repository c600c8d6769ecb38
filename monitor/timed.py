"""The attached probe's iterator: times each next() of a user's DataLoader and, when the user
allows mid-epoch moves (`monitor run --autotune-every-steps N`), applies a requested loader
change at a step boundary instead of waiting for the epoch's end.

A mid-epoch change rebuilds the DataLoader's iterator over the batches the epoch has not
yet delivered, so the training loop sees every batch of the epoch once, in the same order.
That needs the epoch's order fixed in advance: at iter(loader) the loader's own batch
sampler is drawn once (its randomness is the epoch's, as it would have been) into an
EpochPlan, which the iterator is built from and which can start again at any position. It
is possible only for a map-style dataset with a batch sampler; an IterableDataset has no
position to resume from (its stream would restart or skip), and batch_size=None has no
batch sampler: those wait for the epoch, and say so once. The new workers draw new random
seeds, as at any epoch start.

Only the standard library is imported here (the user's environment, like attach.py).
"""
from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monitor.attach import Recorder

EVERY_ENV = "STARVATION_MONITOR_EVERY_STEPS"
CHECK_S = 0.5  # how often, between two steps, pending requests are read mid-epoch


def every_steps() -> int | None:
    """N from the environment `monitor run --autotune-every-steps N` sets (None: off)."""
    try:
        n = int(os.environ.get(EVERY_ENV) or 0)
    except ValueError:
        return None
    return n if n > 0 else None


def why_not_resumable(loader: Any) -> str | None:
    """Why this loader's epoch cannot be resumed at a step (None: it can)."""
    data = sys.modules.get("torch.utils.data")
    iterable = getattr(data, "IterableDataset", None)
    if iterable is not None and isinstance(getattr(loader, "dataset", None), iterable):
        return ("its dataset is an IterableDataset: a stream has no position to resume "
                "from, so a change waits for the next epoch")
    if getattr(loader, "batch_sampler", None) is None:
        return ("it has no batch sampler (batch_size=None): a change waits for the next "
                "epoch")
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
    # when built (and a persistent iterator's _reset), and it is put back at once.
    object.__setattr__(loader, "batch_sampler", plan)
    try:
        return orig_iter(loader)
    finally:
        object.__setattr__(loader, "batch_sampler", own)


class TimedIterator:
    """Wraps a DataLoader iterator: times each next() and the gap until the following one;
    with `every` (mid-epoch moves allowed), every CHECK_S between two steps it lets the
    recorder apply a pending change (the autotuner judges every `every` steps)."""

    def __init__(self, loader: Any, orig_iter: Any, rec: Recorder, t_start: float,
                 every: int | None = None) -> None:
        self._loader, self._orig, self._rec, self._every = loader, orig_iter, rec, every
        self._plan: EpochPlan | None = None
        if every and rec.resumable(loader):
            self._plan = EpochPlan(list(loader.batch_sampler))
        self._inner = build(loader, orig_iter, self._plan)
        self._t_req = t_start  # iter() counts in the epoch's first wait: workers start there
        self._t_got: float | None = None
        self._batch: Any = None
        self.delivered = 0
        self._checked = t_start

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        now = time.perf_counter()
        probe = self._rec.probe
        if self._t_got is not None:
            self._rec.record(self._t_req, self._t_got, now, self._batch)
            if self._plan is not None and now - self._checked >= CHECK_S:
                self._checked = now
                self._rebuild_if_asked()
            self._t_req = time.perf_counter()  # a flush in record() is neither wait nor step
        probe.waiting_since = self._t_req  # the watchdog's clock: waiting for data
        try:
            batch = next(self._inner)
        except StopIteration:
            self._t_got = None
            self._rec.flush()
            raise
        finally:
            probe.waiting_since = None
        self._t_got, self._batch = time.perf_counter(), batch
        self.delivered += 1
        return batch

    def _rebuild_if_asked(self) -> None:
        """Apply pending requests now; if the settings changed, stop this iterator's
        workers and go on from the next undelivered batch under the new settings."""
        old = self._inner
        if not self._rec.apply_pending(self._loader, at_step=self.delivered):
            return
        getattr(old, "_shutdown_workers", lambda: None)()
        self._plan.start = self.delivered
        self._inner = build(self._loader, self._orig, self._plan)

    def __len__(self) -> int:
        return len(self._inner) + (self._plan.start if self._plan is not None else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
