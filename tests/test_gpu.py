"""NVML backend against a scripted stand-in for pynvml (no GPU or driver needed)."""
from __future__ import annotations

import sys
import types

from monitor.gpu import NoGpu, open_backend
from monitor.gpu.nvml import NvmlBackend


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


def fake_nvml(devices: list[dict], init_error: Exception | None = None):
    """devices: dicts with util (gpu, memory) or an exception, mem (used, total), lost."""

    def handle(i):
        if devices[i].get("lost"):
            raise NVMLError("GPU is lost")
        return i

    def util(h):
        u = devices[h]["util"]
        if isinstance(u, Exception):
            raise u
        return types.SimpleNamespace(gpu=u[0], memory=u[1])

    def mem(h):
        used, total = devices[h].get("mem", (1 << 30, 8 << 30))
        return types.SimpleNamespace(used=used, total=total)

    def init():
        if init_error:
            raise init_error

    return types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices), nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: f"Fake GPU {h}".encode(),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}", nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetMemoryInfo=mem,
    )


def test_no_library_is_a_notice_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    b = open_backend()
    assert isinstance(b, NoGpu) and not b.available
    assert "nvidia-ml-py" in b.notice and b.sample() == []


def test_no_driver_says_so():
    b = open_backend(fake_nvml([], init_error=NVMLError("Driver Not Loaded")))
    assert isinstance(b, NoGpu) and "NVIDIA driver not found" in b.notice


def test_driver_without_devices():
    b = open_backend(fake_nvml([]))
    assert not b.available and "no GPU visible" in b.notice


def test_one_gpu_samples_utilization_and_memory():
    b = NvmlBackend(fake_nvml([{"util": (87, 30), "mem": (2 << 20, 4 << 20)}]),
                    clock=lambda: 5.0)
    assert b.available and b.devices()[0].name == "Fake GPU 0"
    (s,) = b.sample()
    assert (s.ts, s.gpu, s.util_pct, s.mem_util_pct) == (5.0, 0, 87.0, 30.0)
    assert (s.mem_used_mb, s.mem_total_mb) == (2.0, 4.0)


def test_not_supported_field_is_missing_and_other_gpu_goes_on():
    b = NvmlBackend(fake_nvml([{"util": NotSupported("Not Supported")}, {"util": (50, 5)}]))
    a, c = b.sample()
    assert a.util_pct is None and a.mem_used_mb is not None
    assert c.util_pct == 50.0


def test_lost_gpu_at_start_is_skipped():
    b = NvmlBackend(fake_nvml([{"util": (1, 1), "lost": True}, {"util": (60, 6)}]))
    assert [d.index for d in b.devices()] == [1]
    assert [s.util_pct for s in b.sample()] == [60.0]
