"""GPU backends. `open_backend()` returns NVML when it works, else a NoGpu that says why."""
from __future__ import annotations

from monitor.gpu.base import GpuBackend, GpuDevice, GpuPass, resolve_device, workload_gpu
from monitor.gpu.none import NoGpu


def open_backend(nvml_module: object | None = None) -> GpuBackend:
    """NVML if the library loads and sees at least one device; otherwise NoGpu with a notice."""
    from monitor.gpu.nvml import NvmlBackend

    backend = NvmlBackend(nvml_module)
    if backend.available:
        return backend
    return NoGpu(backend.notice)


__all__ = ["GpuBackend", "GpuDevice", "GpuPass", "NoGpu", "open_backend", "resolve_device",
           "workload_gpu"]
