"""Host syncs on CUDA, on fakes (no CUDA here): the probe counts a sample of steps' syncs from
torch's sync debug warnings, by the script's line, showing none of them and leaving the
script's own warnings, filters and mode as they were (NOTE [counting syncs]); the probe
writes a `syncs` event; the finding names them against NVML's utilisation, and not where the
GPU is busy or the loop waits for data."""
from __future__ import annotations

import json
import types
import warnings

import pytest

from monitor.diagnosis.syncs import HOST_SYNCS, host_syncs
from monitor.probe import syncs as syncs_mod
from monitor.probe.device_clock import DeviceClock
from monitor.probe.syncs import REPORT_AFTER, SYNC_EVERY, SyncCount
from monitor.probe.timing import Probe
from tests.test_device_clock import Device, FakeCuda

SYNC_WARNING = ("called a synchronizing CUDA operation (Triggered internally at "
                "/pytorch/c10/cuda/CUDAFunctions.cpp:149.)")


class SyncingCuda(FakeCuda):
    """The fake device with torch's sync debug mode: a sync (`item()`) waits for the device
    and, in "warn" mode, warns from the caller's line as torch does."""

    def __init__(self, dev: Device) -> None:
        super().__init__(dev)
        self.mode = 0
        self.modes: list[int] = []

    def get_sync_debug_mode(self) -> int:
        return self.mode

    def set_sync_debug_mode(self, mode: int) -> None:
        self.mode = mode
        self.modes.append(mode)

    def item(self) -> float:
        if self.mode == 1:
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=2)
        self.dev.host = max(self.dev.host, self.dev.free)  # the host waits for the device
        return 0.0


def test_a_sample_of_steps_is_counted_by_line_and_nothing_is_shown(recwarn):
    dev = Device()
    dev.initialized = True
    cuda = SyncingCuda(dev)
    clock = DeviceClock(cuda)
    shown_before = warnings.showwarning
    steps = SYNC_EVERY // 2 + SYNC_EVERY * REPORT_AFTER
    for i in range(steps):
        dev.host += 0.001
        clock.batch_arrived(i)
        dev.launch(0.01)
        cuda.item()  # a loss.item() in every step
        cuda.item()
        warnings.warn("the script's own warning", UserWarning, stacklevel=1)  # shown as ever
        dev.launch(0.01)
        clock.batch_done()
    sc = clock.syncs
    assert sc is not None and sc.report is not None, (sc.steps, sc.failed)
    r = sc.report
    assert r["steps"] == REPORT_AFTER and r["syncs"] == 2 * REPORT_AFTER
    assert r["per_step"] == pytest.approx(2.0)
    # by the script's line: the two item() calls, once a step each
    assert len(r["sites"]) == 2 and set(r["sites"].values()) == {REPORT_AFTER}, r["sites"]
    assert all(site.startswith("test_syncs.py:") for site in r["sites"])
    # on only for the counted steps, and back to the script's mode after each
    assert cuda.modes == [1, 0] * REPORT_AFTER and cuda.mode == 0
    assert warnings.showwarning is shown_before
    # nothing of torch's shown; the script's own warnings all were
    assert not [w for w in recwarn if "synchronizing" in str(w.message)]
    assert [w for w in recwarn if "own warning" in str(w.message)]  # the script's: shown


def test_a_scripts_once_a_place_warning_is_not_shown_again_by_the_counting():
    """Under the default filters a warning shows once a place; the counting's filter must
    not reset that (a filters' version bump would show it after every counted step)."""
    dev = Device()
    dev.initialized = True
    cuda = SyncingCuda(dev)
    clock = DeviceClock(cuda)
    registry: dict = {}
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        warnings.simplefilter("default")
        for i in range(SYNC_EVERY * 3):
            clock.batch_arrived(i)
            cuda.item()
            warnings.warn_explicit("the script's deprecation", UserWarning, "train.py", 7,
                                   registry=registry)
            clock.batch_done()
    assert [str(w.message) for w in shown] == ["the script's deprecation"]
    assert clock.syncs is not None and clock.syncs.syncs == 3  # counted meanwhile


def test_a_script_that_set_its_own_sync_debug_mode_is_left_to_it():
    dev = Device()
    dev.initialized = True
    cuda = SyncingCuda(dev)
    cuda.mode = 2  # "error": the script is hunting its syncs itself
    sc = SyncCount(cuda)
    sc.start(sc.next_at)
    assert not sc.on and sc.failed and cuda.modes == []


def test_the_probe_writes_the_count_as_an_event(store):
    dev = Device()
    dev.initialized = True
    run = store.create_run("cuda", "attached", {})
    probe = Probe(store, run, clock=lambda: dev.host, wall=lambda: 1000.0 + dev.host,
                  flush_interval=0.05)
    cuda = SyncingCuda(dev)
    probe.device = DeviceClock(cuda)

    def batches():
        for _ in range(SYNC_EVERY // 2 + SYNC_EVERY * REPORT_AFTER + 2):
            dev.host += 0.001
            yield [0] * 8

    for _ in probe.iterate(batches(), 0):
        dev.launch(0.01)
        cuda.item()
    dev.host += 5.0
    probe.flush_final()
    ev = store.events(run, kinds=("syncs",))
    assert len(ev) == 1, ev
    data = json.loads(ev["data"].iloc[0])
    assert data["per_step"] == pytest.approx(1.0) and ev["label"].iloc[0].startswith("1.0 CUDA")


def fed(wait: float = 0.03) -> object:
    """A window's Features as the finding reads them: its data-wait share (starved_share)."""
    return types.SimpleNamespace(starved_share=wait)


REPORT = {"syncs": [{"steps": 8, "syncs": 24, "per_step": 3.0,
                     "sites": {"train.py:88": 16, "train.py:91": 8}}]}


def test_the_finding_names_the_syncs_where_the_gpu_idles_and_data_is_there():
    f = host_syncs(REPORT, fed(), 62.0, 100.0)
    assert f is not None and f.cause == HOST_SYNCS and f.no_more_workers
    assert "busy 62% of the time (NVML)" in f.text and "3.0 CUDA syncs a step" in f.text
    assert "train.py:88: 2.0 a step" in f.text
    assert f.advice[0].param == "script" and "train.py:88" in f.advice[0].reason
    assert f.advice[0].predicted_throughput == pytest.approx(100.0 * 0.97 / 0.62, rel=0.02)


def test_no_finding_where_the_gpu_is_busy_the_loop_starves_or_nothing_syncs():
    assert host_syncs(REPORT, fed(), 95.0, 100.0) is None  # busy: the syncs cost nothing
    assert host_syncs(REPORT, fed(0.4), 62.0, 100.0) is None  # starved by data: not syncs
    assert host_syncs(REPORT, fed(), None, 100.0) is None  # no NVML: not measured
    few = {"syncs": [{"steps": 8, "syncs": 2, "per_step": 0.25, "sites": {}}]}
    assert host_syncs(few, fed(), 62.0, 100.0) is None
    assert syncs_mod.SYNC_EVERY > 1  # a sample of steps, never every step


def test_a_runs_verdict_names_its_host_syncs_from_the_count_and_nvml(store):
    """The probe on the fake device with 3 syncs a step and a fed loop; NVML's utilisation of
    the one GPU stored at 58% over the steps (the collector's rows, as on a machine with
    NVML): the run's steady window is judged `host-syncs`, its sites in the sentence."""
    from monitor.assess.window import assess, steady_window
    from monitor.manage.context import machine_context
    from monitor.records import LOADER, GpuDevice, GpuUtilSample

    dev = Device()
    dev.initialized = True
    run = store.create_run("cuda", "attached", {"num_workers": 2, "batch_size": 8})
    probe = Probe(store, run, clock=lambda: dev.host, wall=lambda: 1000.0 + dev.host,
                  flush_interval=0.05)
    cuda = SyncingCuda(dev)
    probe.device = DeviceClock(cuda)
    store.add_event(run, LOADER, "epoch 0", {"rank": 0, "num_workers": 2, "batch_size": 8,
                                             "epoch": 0})

    def batches():
        for _ in range(SYNC_EVERY // 2 + SYNC_EVERY * REPORT_AFTER + 20):
            dev.host += 0.0005  # fed: the batch is there
            yield [0] * 8

    for _ in probe.iterate(batches(), 0):
        for _ in range(3):
            dev.launch(0.004)
            cuda.item()  # the host waits each time
            dev.host += 0.003  # then runs Python while the device idles
    dev.host += 5.0
    probe.flush_final()
    steps = store.steps(run)
    store.set_gpu_inventory(True, "", [GpuDevice(0, "fake", None, None, 80_000.0)])
    store.insert([GpuUtilSample(float(t), 0, 58.0, "samples")
                  for t in steps["ts"].iloc[::5]])
    a = assess(steady_window(store, run), machine_context())
    assert a.diagnosis.named == HOST_SYNCS, (a.diagnosis.named, a.diagnosis.headline)
    assert "3.0 CUDA syncs a step" in a.diagnosis.headline
    assert "test_syncs.py:" in a.diagnosis.headline and "busy 58%" in a.diagnosis.headline
