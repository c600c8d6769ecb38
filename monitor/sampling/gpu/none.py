"""The backend used when there is no usable GPU: no samples, and a notice that says why."""
from __future__ import annotations

from monitor.sampling.gpu.base import GpuDevice, GpuPass


class NoGpu:
    available = False

    def __init__(self, notice: str = "no GPU telemetry") -> None:
        self.notice = notice

    def devices(self) -> list[GpuDevice]:
        return []

    def follow_pids(self, pids: set[int]) -> None:
        pass

    def sample(self) -> GpuPass:
        return GpuPass()

    def close(self) -> None:
        pass
