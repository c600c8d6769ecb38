"""The protocol every GPU backend follows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from monitor.records import GpuSample


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    name: str
    uuid: str | None
    mem_total_mb: float | None


class GpuBackend(Protocol):
    available: bool
    notice: str  # one line for the page: what is read, or why nothing is

    def devices(self) -> list[GpuDevice]: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...
