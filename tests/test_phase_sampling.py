"""NOTE [phase sampling] (monitor/probe/phases.py): past discovery, a fast loop has one step
timed in each SAMPLE_S or so of its time; a slow loop has every step timed; the roots' wrapper
stays installed (what dynamo traced never changes under it), returning at its first test on a
step not timed, which runs torch's own backward and optimizer step. In this process, a real
model and optimizer, the clock handed to take() by the test (the sampling's rule is about
loop time, not this box's speed)."""
from __future__ import annotations

import sys

import pandas as pd
import pytest
import torch

from monitor.assess import phases as step_phases
from monitor.probe.phases import DISCOVER_STEPS, NOTE_AFTER_SAMPLED, SAMPLE_S, Phases


class Net(torch.nn.Module):  # a class of this test's own: the probe patches the root's class
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def installed(ph: Phases, model: torch.nn.Module) -> tuple[bool, bool, bool]:
    """(the root's class times, backward is wrapped, optimizer hooks are registered)."""
    opt_hooks = sys.modules["torch.optim.optimizer"]._global_optimizer_pre_hooks
    return (getattr(type(model).__dict__.get("__call__"), "_starvation_phases", False),
            getattr(torch.autograd.backward, "_starvation_phases", False),
            any(getattr(h, "__self__", None) is ph for h in opt_hooks.values()))


def loop(ph: Phases, model: torch.nn.Module, opt: torch.optim.Optimizer, n: int,
         step_s: float, accumulate: int = 1, start: float = 0.0) -> list[tuple]:
    """n steps, the loop's clock moving step_s a step; each step's take()."""
    out, now = [], start
    x = torch.ones(2, 4)
    for i in range(n):
        # the roots' class times once discovery has found them, and stays; backward and the
        # optimizer step are ours on a timed step alone
        on = ph.armed or not ph.swaps  # (nothing is swapped once the script compiles)
        assert installed(ph, model) == (ph.steps >= DISCOVER_STEPS, on, on)
        model(x).sum().backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
        now += step_s
        out.append(ph.take(now))
    return out


@pytest.fixture
def setup():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    ph = Phases(lambda why: pytest.fail(why))
    assert ph.install()
    try:
        yield ph, model, opt
    finally:
        ph.remove()
    assert installed(ph, model) == (False, False, False)
    assert "__call__" not in Net.__dict__


def test_a_fast_loop_has_one_step_timed_in_each_sample_period(setup):
    ph, model, opt = setup
    loop(ph, model, opt, DISCOVER_STEPS, 0.001)
    assert ph.sampling and list(ph.roots.values()) == [model]
    got = loop(ph, model, opt, 4000, 0.001, start=1.0)  # 4 s of 1 ms steps
    timed = [t for t in got if t[0] is not None]
    # one per 0.5 to 1.5 SAMPLE_S of loop: 4 s / 20 ms = 200 on average
    assert 4.0 / (1.5 * SAMPLE_S) <= len(timed) <= 4.0 / (0.5 * SAMPLE_S), len(timed)
    assert all(t[0] > 0 and t[1] > 0 and t[2] > 0 for t in timed), timed[:3]
    assert all(t == (None, None, None) for t in got if t[0] is None)


def test_a_step_longer_than_the_period_is_timed_every_time(setup):
    ph, model, opt = setup
    got = loop(ph, model, opt, 200, 1.5 * SAMPLE_S)
    assert all(t[0] is not None for t in got) and ph.armed


def test_gradient_accumulation_is_read_at_every_point_of_its_cycle(setup):
    """An optimizer step in 16: the timed steps land on it as often as the loop has it
    (random periods), and no "not a torch optimizer" note comes of the steps without it."""
    ph, model, opt = setup
    got = loop(ph, model, opt, 40_000, 0.001, accumulate=16)
    timed = [t for t in got[DISCOVER_STEPS:] if t[0] is not None]
    assert len(timed) >= NOTE_AFTER_SAMPLED, len(timed)
    with_opt = sum(1 for t in timed if (t[2] or 0) > 0) / len(timed)
    assert 1 / 16 / 2 < with_opt < 1 / 16 * 2, with_opt
    assert ph.note is None


def test_a_step_not_timed_reads_no_clock_of_ours():
    """The phases' clock is read six times a timed step (forward, backward, optimizer: a
    start and an end each) and never on a step not timed."""
    import time

    reads = []

    def clock() -> float:
        reads.append(1)
        return time.perf_counter()

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    ph = Phases(lambda why: pytest.fail(why), clock=clock)
    assert ph.install()
    try:
        got = loop(ph, model, opt, 400, 0.001)
    finally:
        ph.remove()
    timed = sum(1 for t in got if t[0] is not None)
    assert timed < 100 and len(reads) == 6 * timed, (timed, len(reads))


def test_once_the_script_asks_to_compile_nothing_is_swapped_again(setup):
    """Dynamo guards on what it traces (a compiled optimizer step: its hooks): from the
    moment a backend is registered, backward and the optimizer hooks stay ours, and the
    steps are still sampled by the flag alone."""
    ph, model, opt = setup
    loop(ph, model, opt, 50, 0.001)
    assert ph.sampling and ph.swaps
    torch.compile(lambda x: x + 1, backend="eager")  # registered, never called
    got = loop(ph, model, opt, 400, 0.001, start=1.0)
    assert not ph.swaps and installed(ph, model) == (True, True, True)
    timed = sum(1 for t in got if t[0] is not None)
    assert 0 < timed < 100, timed


def test_a_windows_shares_are_its_timed_steps_alone():
    """Steps with no phase (not timed) are left out of the shares and the per-step chart."""
    timed = {"wait_s": 0.001, "compute_s": 0.010, "forward_s": 0.002, "backward_s": 0.005,
             "optimizer_s": 0.001}
    plain = {"wait_s": 0.001, "compute_s": 0.010, "forward_s": None, "backward_s": None,
             "optimizer_s": None}
    steps = pd.DataFrame([timed if i % 10 == 0 else plain for i in range(100)])
    per = step_phases.per_step(steps)
    assert len(per) == 10
    sh = step_phases.shares(steps)
    assert sh["backward"] == pytest.approx(0.005 / 0.011)
    assert sh["seconds_per_step"]["other"] == pytest.approx(0.002)
