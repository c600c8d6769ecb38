"""GPU backends. `open_backend()` returns NVML when it works, else a NoGpu that says why."""
from __future__ import annotations

from monitor.sampling.gpu.base import GpuBackend, GpuDevice, GpuPass
from monitor.sampling.gpu.none import NoGpu


def open_backend(nvml_module: object | None = None) -> GpuBackend:
    """NVML if the library loads and sees at least one device; otherwise NoGpu with a notice."""
    from monitor.sampling.gpu.nvml import NvmlBackend

    backend = NvmlBackend(nvml_module)
    if backend.available:
        return backend
    return NoGpu(backend.notice)


__all__ = ["GpuBackend", "GpuDevice", "GpuPass", "NoGpu", "open_backend"]
