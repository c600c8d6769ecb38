"""The accelerator step: a real CUDA model step, or the simulated accelerator without CUDA.

Simulated accelerator (DESIGN.md): with no CUDA device the step holds the "device" for a set
time while the host waits, as `torch.cuda.synchronize()` would; the host thread sleeps, so it
takes no CPU from the loader, like a host blocked on a real GPU.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn

SIMULATE_ENV = "STARVATION_MONITOR_SIMULATE"  # "1" forces the simulated accelerator

MODEL_WIDTHS = {"small": 32, "medium": 96, "large": 256}


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    if isinstance(batch, dict):
        for v in batch.values():
            if isinstance(v, torch.Tensor):
                return v
    return None


class SimulatedAccelerator:
    """Holds the device for `step_time_s` per batch; the host waits (sleeps)."""

    kind = "simulated"

    def __init__(self, step_time_ms: float) -> None:
        self.step_time_s = step_time_ms / 1000.0

    @property
    def description(self) -> str:
        return (f"simulated accelerator (no CUDA device): each step holds the device for "
                f"{self.step_time_s * 1000:g} ms while the host waits")

    def configure(self, step_time_ms: float, model_size: str) -> None:
        self.step_time_s = step_time_ms / 1000.0

    def step(self, batch: Any) -> None:
        x = _first_tensor(batch)
        if x is not None:  # touch the batch, as a host-to-device copy would read it
            float(x.reshape(-1)[:: max(1, x.numel() // 1024)].sum())
        time.sleep(self.step_time_s)


class ConvNet(nn.Module):
    def __init__(self, in_ch: int, width: int, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_ch, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width * 2, 3, stride=2, padding=1), nn.BatchNorm2d(width * 2),
            nn.ReLU(),
            nn.Conv2d(width * 2, width * 2, 3, padding=1), nn.BatchNorm2d(width * 2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width * 2, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class CudaAccelerator:
    """A real small conv net trained on the batch; the step ends with a synchronize, so the
    probe's compute time is device time, not launch time."""

    kind = "cuda"

    def __init__(self, model_size: str, in_channels: int = 3, device: str = "cuda") -> None:
        self.device = torch.device(device)
        self.in_channels = in_channels
        self._build(model_size)

    def _build(self, model_size: str) -> None:
        self.model_size = model_size
        self.model = ConvNet(self.in_channels, MODEL_WIDTHS[model_size]).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()

    @property
    def description(self) -> str:
        name = torch.cuda.get_device_name(self.device)
        return f"CUDA {name}: {self.model_size} conv net, timed with torch.cuda.synchronize()"

    def configure(self, step_time_ms: float, model_size: str) -> None:
        if model_size != self.model_size:
            self._build(model_size)

    def step(self, batch: Any) -> None:
        x, y = batch[0], batch[1]
        x = x.to(self.device, non_blocking=True)
        y = torch.as_tensor(y).to(self.device, non_blocking=True)
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        torch.cuda.synchronize(self.device)


def make_accelerator(step_time_ms: float, model_size: str, in_channels: int = 3):
    """CUDA when a device is present (and not overridden), else the simulated accelerator."""
    if os.environ.get(SIMULATE_ENV) != "1" and torch.cuda.is_available():
        return CudaAccelerator(model_size, in_channels)
    return SimulatedAccelerator(step_time_ms)
