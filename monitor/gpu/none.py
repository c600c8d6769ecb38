"""The backend used when there is no usable GPU: no samples, and a notice that says why."""
from __future__ import annotations

from monitor.gpu.base import GpuDevice
from monitor.records import GpuSample


class NoGpu:
    available = False

    def __init__(self, notice: str = "no GPU telemetry") -> None:
        self.notice = notice

    def devices(self) -> list[GpuDevice]:
        return []

    def sample(self) -> list[GpuSample]:
        return []

    def close(self) -> None:
        pass
