"""NVML backend scenarios against a scripted pynvml stand-in (no GPU or driver needed)."""
from __future__ import annotations

import sys

import pytest

from monitor.assess.devices import resolve_device, workload_gpu
from monitor.sampling.collector import Collector
from monitor.sampling.gpu import NoGpu, open_backend
from monitor.sampling.gpu.base import GpuDevice
from monitor.sampling.gpu.nvml import NvmlBackend
from monitor.sampling.host import HostSampler
from tests.fakes import nvml as fk
from tests.helpers import Clock as HandClock

NOW = 1_800_000_000.0


def Clock(t: float = NOW) -> HandClock:
    return HandClock(t)


def backend(gpus, clock=None, mono=None):
    return NvmlBackend(fk.make(gpus), clock=clock or Clock(), monotonic=mono or Clock(0.0))


def us(t: float) -> int:
    return int(t * 1e6)


def test_no_library_is_a_notice_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing it raises ImportError
    b = open_backend()
    assert isinstance(b, NoGpu) and not b.available
    assert "nvidia-ml-py" in b.notice
    p = b.sample()
    assert p.samples == () and p.util == ()


def test_no_driver_says_so():
    b = open_backend(fk.make([], init_error=fk.NVML_ERROR_DRIVER_NOT_LOADED))
    assert isinstance(b, NoGpu) and b.notice.startswith("NVIDIA driver not found")


def test_driver_without_devices():
    b = open_backend(fk.make([]))
    assert not b.available and "no GPU visible" in b.notice


def test_one_gpu_reads_every_buffered_sample_at_driver_time():
    g = fk.FakeGpu(buffer=[(us(NOW - 0.5), 10), (us(NOW - 0.33), 90), (us(NOW - 0.17), 20)])
    b = backend([g])
    assert b.available and b.devices()[0].name == "Fake H200"
    assert b.devices()[0].pci == (0, 0x3B, 0)
    p = b.sample()
    assert [u.util_pct for u in p.util] == [10.0, 90.0, 20.0]
    assert [round(u.ts - NOW, 2) for u in p.util] == [-0.5, -0.33, -0.17]
    assert {u.source for u in p.util} == {"samples"}
    (s,) = p.samples
    assert (s.mem_util_pct, s.sm_clock_mhz, s.power_w, s.temp_c) == (20.0, 1980.0, 350.0, 41.0)
    assert (s.pcie_rx_mbps, s.pcie_tx_mbps) == (2.0, 1.0) and s.lost == 0
    assert s.mem_total_mb == 141 * 1024
    # the next pass returns only what is new
    g.buffer.append((us(NOW + 0.1), 55))
    assert [u.util_pct for u in b.sample().util] == [55.0]


def test_empty_buffer_while_idle_falls_back_to_utilization_rates():
    b = backend([fk.FakeGpu(buffer=[], util=3.0)])
    (u,) = b.sample().util
    assert (u.util_pct, u.source, u.ts) == (3.0, "rates", NOW)


def test_unsupported_samples_buffer_falls_back_and_stops_asking():
    nv = fk.make([fk.FakeGpu(unsupported={"nvmlDeviceGetSamples"}, util=42.0)])
    b = NvmlBackend(nv, clock=Clock())
    for _ in range(3):
        (u,) = b.sample().util
        assert u.source == "rates" and u.util_pct == 42.0
    assert nv.calls["nvmlDeviceGetSamples"] == 1


def test_not_supported_fields_are_missing_and_the_rest_reads():
    g = fk.FakeGpu(unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature",
                                "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetClockInfo"})
    (s,) = backend([g]).sample().samples
    assert s.power_w is None and s.temp_c is None and s.sm_clock_mhz is None
    assert s.pcie_rx_mbps is None and s.mem_used_mb is not None and s.mem_util_pct == 20.0


def test_two_gpus_one_failing_at_start():
    b = backend([fk.FakeGpu(lost=True), fk.FakeGpu(name="Fake B", util=60.0)])
    assert [d.index for d in b.devices()] == [1]
    p = b.sample()
    assert [s.gpu for s in p.samples] == [1] and [u.util_pct for u in p.util] == [60.0]


def test_gpu_lost_mid_run_marks_it_and_the_others_go_on():
    a, c = fk.FakeGpu(util=70.0), fk.FakeGpu(name="Fake C", util=30.0)
    b = backend([a, c])
    assert len(b.sample().samples) == 2
    a.lost = True
    p = b.sample()
    assert p.lost == (0,)
    lost_row = next(s for s in p.samples if s.gpu == 0)
    assert lost_row.lost == 1 and lost_row.mem_used_mb is None
    assert "GPU 0" in b.notice and "lost" in b.notice
    p = b.sample()  # a lost GPU is not asked again; the other still reads
    assert [s.gpu for s in p.samples] == [1] and p.util[0].util_pct == 30.0


def test_driver_timestamps_not_aligned_with_wall_time_get_an_offset():
    base = 1_000.0  # the driver's clock starts near zero (a monotonic base)
    g = fk.FakeGpu(buffer=[(us(base), 10), (us(base + 0.2), 20)])
    clock = Clock(NOW)
    b = backend([g], clock=clock)
    p = b.sample()
    assert [round(u.ts - NOW, 3) for u in p.util] == [-0.2, 0.0]
    g.buffer.append((us(base + 0.45), 30))
    clock.t = NOW + 0.25
    (u,) = b.sample().util
    assert u.ts == pytest.approx(NOW + 0.25)


def test_per_process_sm_utilization_of_the_workload():
    g = fk.FakeGpu(processes=[(4242, us(NOW - 0.3), 60, 10), (4242, us(NOW - 0.1), 80, 20),
                              (999, us(NOW - 0.1), 15, 1)])
    b = backend([g])
    assert b.sample().samples[0].proc_sm_pct is None  # no workload watched yet
    b2 = backend([g])
    b2.follow_pids({4242})
    s = b2.sample().samples[0]
    assert s.proc_sm_pct == 70.0 and s.proc_mem_pct == 15.0
    b3 = backend([g])
    b3.follow_pids({1234})
    assert b3.sample().samples[0].proc_sm_pct == 0.0  # other processes only


def test_gpm_sm_activity_needs_two_samples_100ms_apart():
    mono = Clock(10.0)
    b = backend([fk.FakeGpu(gpm=True, sm_active=37.5, sm_occupancy=12.0)], mono=mono)
    assert b.devices()[0].gpm
    assert b.sample().samples[0].sm_active_pct is None  # first GPM sample only
    mono.t += 0.05
    assert b.sample().samples[0].sm_active_pct is None  # too soon: < 100 ms
    mono.t += 0.1
    s = b.sample().samples[0]
    assert (s.sm_active_pct, s.sm_occupancy_pct) == (37.5, 12.0)


def test_gpm_unsupported_device_reports_none():
    s = backend([fk.FakeGpu(gpm=False)]).sample().samples[0]
    assert s.sm_active_pct is None and s.sm_occupancy_pct is None


DEVS = [GpuDevice(0, "A", "GPU-aaaa-1", (0, 0x1A, 0), 1.0),
        GpuDevice(1, "B", "GPU-bbbb-2", (0, 0x3B, 0), 1.0)]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"uuid": "GPU-bbbb-2"}, 1),
        ({"uuid": "bbbb-2"}, 1),  # torch's uuid has no "GPU-" prefix
        ({"pci": [0, 0x1A, 0]}, 0),
        ({"cuda_index": 0, "cuda_visible": "1"}, 1),
        ({"cuda_index": 1, "cuda_visible": "1,0"}, 0),
        ({"cuda_index": 0, "cuda_visible": "GPU-bbbb"}, 1),
        ({"cuda_index": 0, "cuda_visible": "GPU-"}, None),  # ambiguous prefix
        ({"cuda_index": 0}, 0),
        ({"cuda_index": 5}, None),
        ({}, None),
    ],
)
def test_cuda_device_maps_to_nvml_index(kwargs, expected):
    assert resolve_device(DEVS, **kwargs) == expected


def test_workload_gpu_from_run_device_record():
    assert workload_gpu(DEVS, {"uuid": "GPU-aaaa-1", "cuda_index": 0}) == 0
    assert workload_gpu(DEVS, None) is None


def test_collector_writes_util_samples_and_gpu_rows(store):
    g = fk.FakeGpu(buffer=[(us(NOW - 0.2), 50), (us(NOW - 0.1), 60)])
    col = Collector(store, host=HostSampler(), gpu=NvmlBackend(fk.make([g]), clock=Clock()))
    col.sample_once()
    col.flush()
    assert store.gpu_util(0)["util_pct"].tolist() == [50.0, 60.0]
    assert len(store.gpu_samples(0)) == 1 and col.errors == 0
    assert col.last_pass_s is not None and col.last_pass_s < 1.0


def test_each_rank_maps_to_its_own_nvml_gpu(store):
    """Two ranks on one host report their CUDA devices; CUDA and NVML number them
    differently, the UUID decides."""
    import types

    from monitor.probe import identity
    from monitor.ui.panels import rank_gpus
    from tests.fakes.cuda import fake_torch

    props = types.SimpleNamespace(uuid="bbbb-2", pci_domain_id=0, pci_bus_id=0x3B,
                                  pci_device_id=0)
    with fake_torch(is_initialized=lambda: True, current_device=lambda: 0,
                    get_device_properties=lambda i: props):
        dev = identity.cuda_device()
    assert dev["uuid"] == "GPU-bbbb-2" and dev["cuda_index"] == 0
    run = store.create_run("job", "attached", {})
    store.set_rank(run, 0, 0, 2, "h", 1, {}, "cuda", {"uuid": "GPU-aaaa-1", "cuda_index": 0})
    store.set_rank(run, 1, 1, 2, "h", 2, {}, "cuda", dev)
    assert rank_gpus(store.ranks(run), DEVS, [0, 1]) == [0, 1]  # CUDA 0 on both: UUIDs differ
    assert rank_gpus(store.ranks(run), [], [0, 1]) == [None, None]
