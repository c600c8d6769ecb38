"""The device's own clock on CUDA (monitor/probe/device_clock.py), on a fake `torch.cuda`
whose events complete on a scripted device timeline: one in-order stream that runs queued
kernels back to back and reaches an event once everything queued before it is done. The
idle/span arithmetic, the event pool, the never-block rule, incomplete events, no CUDA call
before the script's own, and the probe writing the figures with its steps."""
from __future__ import annotations

import pytest

from monitor.probe import device_clock
from monitor.probe.device_clock import MAX_PENDING, DeviceClock
from monitor.probe.timing import Probe


class Device:
    """The scripted timeline: `host` is the host's clock (s); the stream is free at `free`."""

    def __init__(self) -> None:
        self.host = 0.0
        self.free = 0.0
        self.calls: list[str] = []
        self.initialized = False
        self.events_made = 0

    def launch(self, seconds: float) -> None:
        """The host queues a kernel of `seconds` of device time (launching costs nothing)."""
        self.free = max(self.free, self.host) + seconds


class FakeEvent:
    def __init__(self, dev: Device) -> None:
        self.dev, self.t = dev, None

    def record(self) -> None:
        self.dev.calls.append("record")
        self.t = max(self.dev.free, self.dev.host)  # reached when the queue before it is done

    def query(self) -> bool:
        self.dev.calls.append("query")
        return self.t is not None and self.dev.host >= self.t

    def elapsed_time(self, end: FakeEvent) -> float:
        self.dev.calls.append("elapsed_time")
        if not (self.query() and end.query()):  # CUDA raises for an incomplete event
            raise RuntimeError("event not complete")
        return (end.t - self.t) * 1000.0


class FakeCuda:
    """Only what the clock may touch: no synchronize, no set_device, no current_device."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev

    def is_initialized(self) -> bool:
        self.dev.calls.append("is_initialized")
        return self.dev.initialized

    def Event(self, enable_timing: bool = False) -> FakeEvent:
        assert enable_timing
        self.dev.calls.append("Event")
        self.dev.events_made += 1
        return FakeEvent(self.dev)


def loop(clock: DeviceClock, dev: Device, waits: list[float], kernel_s: float,
         launch_s: float = 0.001, lag: float = 0.0) -> dict[int, tuple[float | None, float]]:
    """A training loop: wait for the batch (host time), queue `kernel_s` of device work,
    harvest at each step boundary as the probe does. `lag`: the device runs this far behind
    (queued work from before)."""
    out: dict[int, tuple[float | None, float]] = {}
    dev.free = dev.host + lag
    for i, w in enumerate(waits):
        dev.host += w  # next() blocks on the loader
        clock.batch_arrived(i)
        dev.launch(kernel_s)
        dev.host += launch_s  # the host runs ahead: no sync
        clock.batch_done()
        out.update(clock.harvest())
    dev.host += 10.0  # much later: everything queued has run
    out.update(clock.harvest())
    return out


def test_idle_and_span_of_a_starved_and_a_fed_device():
    dev = Device()
    dev.initialized = True
    clock = DeviceClock(FakeCuda(dev))
    # starved: 50 ms data wait, 20 ms kernels: the device idles ~31 ms before each step
    got = loop(clock, dev, [0.05] * 10, 0.02)
    assert sorted(got) == list(range(10))
    assert got[0][0] is None  # no step before the first: no idle measured
    for i in range(1, 10):
        idle, span, _ = got[i]
        assert span == pytest.approx(0.02)
        assert idle == pytest.approx(0.05 + 0.001 - 0.02)
    # fed: 1 ms wait, 20 ms kernels queued back to back: never idle, each spans its kernel
    fed = DeviceClock(FakeCuda(dev))
    got = loop(fed, dev, [0.001] * 10, 0.02)
    assert all(got[i][0] == pytest.approx(0.0) for i in range(1, 10))
    assert all(got[i][1] == pytest.approx(0.02) for i in range(10))
    assert fed.measured == 10 and fed.dropped == 0


def test_nothing_blocks_and_incomplete_events_wait_or_are_dropped():
    dev = Device()
    dev.initialized = True
    clock = DeviceClock(FakeCuda(dev))
    dev.free = 1e9  # a device far behind: nothing it is given completes
    for i in range(MAX_PENDING + 8):
        clock.batch_arrived(i)
        dev.launch(0.01)
        clock.batch_done()
        assert clock.harvest() == {}  # returns at once: nothing complete, nothing read
    assert "elapsed_time" not in dev.calls  # never read before query() said complete
    assert clock.dropped == 8 and len(clock.pending) == MAX_PENDING
    assert not hasattr(FakeCuda, "synchronize")  # the fake has none: a call would raise


def test_events_come_from_a_bounded_pool():
    dev = Device()
    dev.initialized = True
    clock = DeviceClock(FakeCuda(dev))
    loop(clock, dev, [0.01] * 500, 0.005)
    assert clock.measured == 500
    assert dev.events_made <= 8  # reused: two per step outstanding, a few in flight
    assert len(clock.pool) <= device_clock.POOL


def test_no_cuda_call_before_the_script_initialises_cuda():
    dev = Device()
    clock = DeviceClock(FakeCuda(dev))
    loop(clock, dev, [0.01] * 5, 0.005)
    assert set(dev.calls) == {"is_initialized"} and dev.events_made == 0
    dev.initialized = True  # the script put a tensor on the device
    got = loop(clock, dev, [0.01] * 70, 0.005)  # looked for every LOOK_EVERY steps
    assert 0 < len(got) and min(got) <= device_clock.LOOK_EVERY
    clock = DeviceClock(FakeCuda(dev))
    dev.initialized = False
    loop(clock, dev, [0.01] * 5, 0.005)
    dev.initialized = True
    clock.look()  # an epoch starts: the next step looks
    got = loop(clock, dev, [0.01] * 5, 0.005)
    assert sorted(got) == [0, 1, 2, 3, 4] and dev.events_made > 0


def test_a_cuda_error_stops_the_clock_not_the_training():
    dev = Device()
    dev.initialized = True
    cuda = FakeCuda(dev)
    clock = DeviceClock(cuda)

    def broken(enable_timing: bool = False):
        raise RuntimeError("CUDA error: an illegal memory access")
    cuda.Event = broken
    clock.batch_arrived(0)
    clock.batch_done()
    assert clock.harvest() == {} and not clock.active
    assert clock.failed.startswith("RuntimeError: CUDA error")


def test_the_probe_writes_device_times_with_its_steps(store):
    """Through the one timed iterator: steps stored with device idle and span, the flush
    holding a step back while its events are out (not longer than HOLD_S)."""
    dev = Device()
    dev.initialized = True
    run = store.create_run("cuda", "attached", {})
    probe = Probe(store, run, clock=lambda: dev.host, wall=lambda: 1000.0 + dev.host,
                  flush_interval=0.05)
    probe.device = DeviceClock(FakeCuda(dev))

    def batches():
        for _ in range(40):
            dev.host += 0.03  # the loader's wait
            yield [0] * 8

    for _ in probe.iterate(batches(), 0):
        dev.launch(0.01)
        dev.host += 0.001
    dev.host += 5.0
    probe.flush_final()
    steps = store.steps(run)
    assert len(steps) == 40
    timed = steps.dropna(subset=["device_span_s"])
    assert len(timed) >= 38, steps[["step", "device_idle_s", "device_span_s"]]
    assert timed["device_span_s"].median() == pytest.approx(0.01)
    assert timed["device_idle_s"].dropna().median() == pytest.approx(0.03 + 0.001 - 0.01)
    from monitor.frames.analysis import device_timing

    d = device_timing(steps)
    assert d is not None and d["idle_share"] == pytest.approx(0.021 / 0.031, rel=0.05)


def test_a_cpu_run_has_no_device_times(store):
    """On the CPU build here, real torch: the clock never starts (torch.cuda is not
    initialised), the steps carry no device times, and the chart says host timing."""
    torch = pytest.importorskip("torch")
    assert not torch.cuda.is_initialized()
    run = store.create_run("cpu", "attached", {})
    probe = Probe(store, run)
    for _ in probe.iterate([torch.zeros(2)] * 30, 0):
        pass
    probe.flush_final()
    assert not probe.device.active and probe.device.pool == []
    steps = store.steps(run)
    assert len(steps) == 30 and steps["device_span_s"].isna().all()
    assert not torch.cuda.is_initialized()  # and nothing here initialised it


def test_phase_marks_are_device_time_and_a_closures_passes_are_not_the_optimizers():
    """Marks at each phase's start and end (as the phase hooks make them) on the scripted
    stream: each phase reads its kernels' device time, however far the host ran ahead; an
    optimizer step that runs forward and backward inside it (a closure) keeps only its own."""
    dev = Device()
    dev.initialized = True
    clock = DeviceClock(FakeCuda(dev))
    F, B, OPT = device_clock.FORWARD, device_clock.BACKWARD, device_clock.OPTIMIZER

    def timed(phase: int, seconds: float) -> None:
        clock.mark(phase, False)
        dev.launch(seconds)
        dev.host += 0.0001  # a launch: the host does not wait for the kernel
        clock.mark(phase, True)

    got = {}
    for i in range(6):
        dev.host += 0.02  # the loader's wait
        clock.batch_arrived(i)
        if i % 2 == 0:  # a plain step
            timed(F, 0.005)
            timed(B, 0.010)
            timed(OPT, 0.003)
        else:  # LBFGS-style: the closure's passes inside the optimizer step
            clock.mark(OPT, False)
            timed(F, 0.005)
            timed(B, 0.010)
            dev.launch(0.003)
            clock.mark(OPT, True)
        dev.launch(0.002)  # the loop's own kernels: other
        clock.batch_done()
        got.update(clock.harvest())
    dev.host += 10.0
    got.update(clock.harvest())
    for i in range(6):
        _idle, span, (fwd, bwd, opt) = got[i]
        assert (fwd, bwd, opt) == pytest.approx((0.005, 0.010, 0.003)), i
        assert span == pytest.approx(0.020), i
    clock.batch_arrived(6)  # a step with no phase marked: none, not zeros
    clock.batch_done()
    dev.host += 10.0
    assert clock.harvest()[6][2] is None
    assert len(clock.pool) <= device_clock.POOL and dev.events_made <= 24  # reused


def test_the_probe_stores_device_phases_from_the_real_phase_hooks(store):
    """The phase hooks installed on real torch (monitor/probe/phases.py) over a model whose
    forward, backward and optimizer step queue 5, 10 and 3 ms of kernels on the scripted
    device, and 2 ms of the loop's own: the stored phases are those device times (the host
    ran ahead in microseconds), before and after discovery hands the roots to their class,
    and the window's phases say device time with the 2 ms as other."""
    torch = pytest.importorskip("torch")
    from monitor.assess import phases as step_phases
    from monitor.probe.phases import Phases

    dev = Device()
    dev.initialized = True

    class Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            dev.launch(0.010)
            return g

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, x):
            dev.launch(0.005)
            return Slow.apply(x * self.w).sum()

    class Sgd(torch.optim.SGD):
        def step(self, closure=None):
            dev.launch(0.003)
            return super().step(closure)

    run = store.create_run("cuda", "attached", {})
    probe = Probe(store, run, clock=lambda: dev.host, wall=lambda: 1000.0 + dev.host,
                  flush_interval=0.05)
    probe.device = DeviceClock(FakeCuda(dev))
    ph = Phases(lambda why: pytest.fail(why))
    assert ph.install()
    ph.device, probe.phases = probe.device, ph
    try:
        model = Net()
        opt = Sgd(model.parameters(), lr=0.1)

        def batches():
            for _ in range(30):
                dev.host += 0.03  # starved: the device idles meanwhile
                yield torch.ones(8, 2)

        for x in probe.iterate(batches(), 0):
            opt.zero_grad()
            model(x).backward()
            opt.step()
            dev.launch(0.002)  # the loop's own
            dev.host += 0.001
        dev.host += 5.0
        probe.flush_final()
    finally:
        ph.remove()
    steps = store.steps(run)
    # the steps the device clock timed, and of them those the phases timed (one step in each
    # SAMPLE_S or so of the loop: NOTE [phase sampling]; these steps are 31 ms apart)
    assert len(steps.dropna(subset=["device_span_s"])) >= 28, steps
    timed = steps.dropna(subset=["device_span_s", "forward_s"])
    assert len(timed) >= 10, steps
    for col, want in (("forward_s", 0.005), ("backward_s", 0.010), ("optimizer_s", 0.003)):
        assert timed[col].tolist() == pytest.approx([want] * len(timed)), (col, timed[col])
    sh = step_phases.shares(timed)
    assert sh["source"] == step_phases.DEVICE
    assert sh["seconds_per_step"]["other"] == pytest.approx(0.002)
    assert step_phases.sentence(sh).endswith("(device time, CUDA events).")
