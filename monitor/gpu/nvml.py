"""NVML through nvidia-ml-py: the only module that imports pynvml.

Every read goes through `_query`, which turns NVML errors (NOT_SUPPORTED, NO_PERMISSION, GPU
lost...) into a missing value, so one unsupported field never kills the loop (DESIGN.md style
rule 2). An import or init failure is recorded in `notice` and never raised (rule 3).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from monitor.gpu.base import GpuDevice
from monitor.records import GpuSample

MB = 1024 * 1024
NO_DRIVER_HINT = "NVIDIA driver not found: showing the simulated accelerator's step-derived series"


def _load_pynvml() -> tuple[ModuleType | None, str]:
    try:
        import pynvml  # the one import of pynvml in the project
    except ImportError as exc:
        return None, f"nvidia-ml-py is not installed ({exc}): pip install nvidia-ml-py"
    return pynvml, ""


class NvmlBackend:
    """Samples utilization and memory of every NVML device."""

    def __init__(
        self, nvml: ModuleType | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.available = False
        self.notice = ""
        self._handles: list[Any] = []
        self._devices: list[GpuDevice] = []
        if nvml is None:
            nvml, err = _load_pynvml()
            if nvml is None:
                self.notice = err
                return
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.notice = f"{NO_DRIVER_HINT} ({exc})"
            return
        count = self._query(nvml.nvmlDeviceGetCount, default=0)
        for i in range(count):
            h = self._query(nvml.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                continue
            name = self._query(nvml.nvmlDeviceGetName, h, default=f"GPU {i}")
            uuid = self._query(nvml.nvmlDeviceGetUUID, h)
            mem = self._query(nvml.nvmlDeviceGetMemoryInfo, h)
            self._handles.append((i, h))
            self._devices.append(GpuDevice(
                i, name.decode() if isinstance(name, bytes) else str(name),
                uuid.decode() if isinstance(uuid, bytes) else uuid,
                mem.total / MB if mem is not None else None,
            ))
        if not self._handles:
            self.notice = ("NVIDIA driver loaded but no GPU visible: showing the simulated "
                           "accelerator")
            return
        self.available = True
        self.notice = "GPU utilization from NVML: " + ", ".join(d.name for d in self._devices)

    def _query(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except Exception:  # pynvml.NVMLError and its subclasses; one field, not the loop
            return default

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def sample(self) -> list[GpuSample]:
        nv = self.nvml
        out = []
        now = self.clock()
        for i, h in self._handles:
            util = self._query(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._query(nv.nvmlDeviceGetMemoryInfo, h)
            out.append(GpuSample(
                ts=now, gpu=i,
                util_pct=float(util.gpu) if util is not None else None,
                mem_util_pct=float(util.memory) if util is not None else None,
                mem_used_mb=mem.used / MB if mem is not None else None,
                mem_total_mb=mem.total / MB if mem is not None else None,
                source="utilization_rates",
            ))
        return out

    def close(self) -> None:
        if self.available:
            self._query(self.nvml.nvmlShutdown)
            self.available = False
