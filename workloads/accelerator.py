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

MODEL_WIDTHS = {"auto": 64, "small": 32, "medium": 96, "large": 256}


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

    def device_info(self) -> dict[str, Any] | None:
        return None

    def step(self, batch: Any) -> float | None:
        """Returns the host-to-device copy time (None: there is no device memory here)."""
        x = _first_tensor(batch)
        if x is not None:  # touch the batch, as a host-to-device copy would read it
            float(x.reshape(-1)[:: max(1, x.numel() // 1024)].sum())
        time.sleep(self.step_time_s)
        return None


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


class TorchAccelerator:
    """A real small conv net trained on each batch. On CUDA the step ends with a synchronize,
    so the probe's compute time is device time, not launch time.

    model_size "auto" (the default) keeps a width-64 net and repeats its training pass so a
    step takes about `step_time_ms` on this device (calibrated on the first batch), so the
    presets behave on any GPU as they do on the simulated accelerator; "small", "medium" and
    "large" are fixed widths with one pass per step.
    """

    def __init__(self, model_size: str, step_time_ms: float, in_channels: int = 3,
                 device: str = "cuda") -> None:
        self.device = torch.device(device)
        self.kind = "cuda" if self.device.type == "cuda" else "cpu"
        self.in_channels = in_channels
        self.step_time_ms = step_time_ms
        self.repeats: int | None = None
        self._build(model_size)

    def _build(self, model_size: str) -> None:
        self.model_size = model_size
        width = MODEL_WIDTHS.get(model_size, MODEL_WIDTHS["auto"])
        self.model = ConvNet(self.in_channels, width).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        self.repeats = None if model_size == "auto" else 1

    @property
    def description(self) -> str:
        if self.device.type == "cuda":
            where = f"CUDA {torch.cuda.get_device_name(self.device)}"
        else:
            where = f"torch device {self.device}"
        size = (f"width-64 conv net, {self.repeats or '?'} passes/step for ~"
                f"{self.step_time_ms:g} ms" if self.model_size == "auto"
                else f"{self.model_size} conv net")
        return f"{where}: {size}, timed with a synchronize"

    def device_info(self) -> dict[str, Any] | None:
        """How the collector finds this GPU in NVML: UUID and PCI location."""
        if self.device.type != "cuda":
            return None
        idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        uuid = getattr(p, "uuid", None)
        pci = [getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        return {"cuda_index": idx, "name": p.name,
                "uuid": f"GPU-{uuid}" if uuid is not None else None,
                "pci": pci if None not in pci else None,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def configure(self, step_time_ms: float, model_size: str) -> None:
        if model_size != self.model_size:
            self._build(model_size)
        if step_time_ms != self.step_time_ms:
            self.step_time_ms = step_time_ms
            if self.model_size == "auto":
                self.repeats = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _train_pass(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model(x), y).backward()
        self.opt.step()

    def _calibrate(self, x: torch.Tensor, y: torch.Tensor) -> int:
        for _ in range(2):
            self._train_pass(x, y)
        self._sync()
        t0 = time.perf_counter()
        for _ in range(3):
            self._train_pass(x, y)
        self._sync()
        per = (time.perf_counter() - t0) / 3
        return max(1, round(self.step_time_ms / 1000.0 / max(per, 1e-6)))

    def step(self, batch: Any) -> float | None:
        """Copy, train, synchronize. Returns the host-to-device copy time: on CUDA measured
        with events around the copies (pageable memory makes non_blocking copies
        synchronous, which is what transfer-bound looks like), else None."""
        x = _first_tensor(batch)
        y = batch[1] if isinstance(batch, (list, tuple)) and len(batch) > 1 else None
        y = (torch.as_tensor(y) if y is not None else torch.zeros(len(x), dtype=torch.long))
        cuda = self.device.type == "cuda"
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
        x = x.to(self.device, non_blocking=True).float()
        y = y.to(self.device, non_blocking=True).long() % 10
        if cuda:
            end.record()
        if self.repeats is None:
            self.repeats = self._calibrate(x, y)
        for _ in range(self.repeats):
            self._train_pass(x, y)
        self._sync()
        return start.elapsed_time(end) / 1000.0 if cuda else None


class UserStep:
    """A user workload's own `model_step(batch)`: the step is whatever it does (on CUDA it
    should end with a synchronize for device time, as ours does). Its kind is "cuda" where
    CUDA is available (the step is assumed to use it), else "cpu": real either way."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.kind = "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def description(self) -> str:
        cuda = " (CUDA available)" if torch.cuda.is_available() else ""
        return f"your model_step {getattr(self.fn, '__name__', 'step')}(){cuda}"

    def configure(self, step_time_ms: float, model_size: str) -> None:
        pass

    def device_info(self) -> dict[str, Any] | None:
        return None

    def step(self, batch: Any) -> float | None:
        self.fn(batch)
        return None


def make_accelerator(step_time_ms: float, model_size: str, in_channels: int = 3):
    """CUDA when a device is present (and not overridden), else the simulated accelerator."""
    if os.environ.get(SIMULATE_ENV) != "1" and torch.cuda.is_available():
        return TorchAccelerator(model_size, step_time_ms, in_channels, "cuda")
    return SimulatedAccelerator(step_time_ms)
