"""The protocol every GPU backend follows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from monitor.records import GpuDevice, GpuSample, GpuUtilSample


@dataclass(frozen=True, slots=True)
class GpuPass:
    """What one sampling pass read: a GpuSample per device, and every utilization sample
    the driver buffered since the last pass."""

    samples: tuple[GpuSample, ...] = ()
    util: tuple[GpuUtilSample, ...] = ()
    lost: tuple[int, ...] = field(default=())  # devices found lost in this pass


class GpuBackend(Protocol):
    available: bool
    notice: str  # one line for the page: what is read, or why nothing is

    def devices(self) -> list[GpuDevice]: ...

    def follow_pids(self, pids: set[int]) -> None: ...

    def sample(self) -> GpuPass: ...

    def close(self) -> None: ...
