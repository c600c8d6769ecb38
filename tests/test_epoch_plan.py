"""Mid-epoch loader changes (monitor/probe/epoch_plan.py) over real DataLoaders: whatever
the change, every epoch yields every sample once, and a shuffled loader draws a new order
each epoch. Two ways the rebuild once broke the job: a persistent iterator kept the first
plan it was built on (every later epoch replayed it, its first batches lost), and an
out-of-order loader (in_order=False) was resumed at a position its batches do not have."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from monitor.probe.epoch_plan import CHECK_S, MidEpoch, why_not_resumable  # noqa: E402
from monitor.probe.timing import Probe, TimedIterator  # noqa: E402
from tests.helpers import Clock as HandClock  # noqa: E402

SAMPLES = 96


def change(loader, settings: dict) -> None:
    """What Recorder.apply does to the loader: the persistent iterator of the old settings
    shut down and dropped, the new settings set."""
    held = getattr(loader, "_iterator", None)
    if held is not None:
        held._shutdown_workers()
        object.__setattr__(loader, "_iterator", None)
    for k, v in settings.items():
        object.__setattr__(loader, k, v)


def Clock() -> HandClock:
    """Each read a step later than CHECK_S: MidEpoch looks for a change between every two
    steps."""
    return HandClock(0.0, step=CHECK_S)


def epochs(store, loader, moves: dict[tuple[int, int], dict], n: int = 3,
           seen_resumable: list | None = None) -> list[list[int]]:
    """`n` epochs through TimedIterator and MidEpoch, as the attach probe runs them;
    `moves[(epoch, step)]` is applied at that step boundary. Each epoch's samples in order."""
    run = store.create_run("plan", "attached", {})
    probe = Probe(store, run, flush_interval=1e9)
    orig = DataLoader.__iter__
    out = []
    for epoch in range(n):
        def pending(ldr, at_step, epoch=epoch):
            settings = moves.get((epoch, at_step))
            if settings is not None:
                change(ldr, settings)
            return settings is not None

        def resumable(ldr, inner):
            ok = why_not_resumable(ldr, inner) is None
            if seen_resumable is not None:
                seen_resumable.append(ok)
            return ok

        mid = MidEpoch(loader, orig, pending, 0.0, clock=Clock(), resumable=resumable)
        it = TimedIterator(probe, epoch, mid.make_iter, between=mid)
        got = [i for _, idx in it for i in idx.tolist()]
        assert len(it) == SAMPLES // 8  # the epoch's length, not what is left of it
        out.append(got)
    held = getattr(loader, "_iterator", None)
    if held is not None:
        held._shutdown_workers()
    return out


def dataset():
    return torch.utils.data.TensorDataset(torch.zeros(SAMPLES, 2), torch.arange(SAMPLES))


def test_a_change_to_persistent_workers_mid_epoch_keeps_every_later_epoch_whole(store):
    loader = DataLoader(dataset(), batch_size=8, shuffle=True)
    to_two = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True}
    got = epochs(store, loader, {(0, 4): to_two})
    for e, order in enumerate(got):
        assert sorted(order) == list(range(SAMPLES)), (e, len(order))
    assert len({tuple(o) for o in got}) == 3, "a shuffled loader replayed one order"
    assert loader.num_workers == 2 and loader.persistent_workers


def test_a_change_between_persistent_settings_mid_epoch(store):
    """Persistent from the start (the iterator held across epochs), changed in the second
    epoch: the third is whole and in a new order."""
    loader = DataLoader(dataset(), batch_size=8, shuffle=True, num_workers=1,
                        persistent_workers=True)
    got = epochs(store, loader, {(1, 5): {"num_workers": 2}})
    for e, order in enumerate(got):
        assert sorted(order) == list(range(SAMPLES)), (e, len(order))
    assert len({tuple(o) for o in got}) == 3


def test_an_out_of_order_loader_is_not_resumed_mid_epoch(store):
    """in_order=False: the batches delivered are not the plan's first ones, so no change
    applies inside the epoch (it waits for the epoch's end), and each epoch stays whole."""
    loader = DataLoader(dataset(), batch_size=8, shuffle=True, num_workers=2,
                        in_order=False)
    seen: list[bool] = []
    got = epochs(store, loader, {(0, 3): {"num_workers": 1}, (1, 3): {"num_workers": 1}},
                 n=2, seen_resumable=seen)
    assert seen and not any(seen)
    assert loader.num_workers == 2  # nothing applied mid-epoch
    for order in got:
        assert sorted(order) == list(range(SAMPLES))
    it = iter(loader)
    reason = why_not_resumable(loader, it)
    it._shutdown_workers()
    assert reason is not None and "in_order=False" in reason
