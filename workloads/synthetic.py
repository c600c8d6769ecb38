"""Synthetic dataset presets with real per-sample work.

Each sample is "decoded" (zlib-decompressed from a compressed payload, as a JPEG or PNG
decoder would inflate bytes), then augmented with real tensor ops (crop, flip, a 3x3 blur by
conv2d, normalisation) repeated `rounds` times; `io_latency_s` models storage latency (a
remote read) with a sleep, which holds no CPU, and reads a real RECORD_BYTES record from
the disk (this file, its pages dropped from the page cache first, as a cold file's are) so
that the process's block I/O accounting shows the reads a storage-bound loader makes.
Costs were calibrated on a 2-core machine so that each preset shows its namesake (see
PRESET_SPECS and README "Presets").
"""
from __future__ import annotations

import os
import time
import zlib

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from monitor.presets import PRESET_SPECS, PresetSpec

FAULT_ENV = "STARVATION_MONITOR_FAULT_AT"
RECORD_BYTES = 4096  # what one sample of a storage-latency preset reads


def _read_record(index: int) -> bytes:
    """One record's bytes, read with read(2) from the block device (open per call, as a
    dataset of files does; the page cache dropped first: a cold file)."""
    fd = os.open(__file__, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.pread(fd, RECORD_BYTES, (index * RECORD_BYTES) % max(1, size - RECORD_BYTES))
    finally:
        os.close(fd)


def _payload(shape: tuple[int, int, int], seed: int = 0) -> bytes:
    """A compressible image-like byte string (smooth gradients plus noise)."""
    c, h, w = shape
    g = torch.Generator().manual_seed(seed)
    yy = torch.linspace(0, 255, h).view(1, h, 1)
    xx = torch.linspace(0, 255, w).view(1, 1, w)
    img = (yy + xx) / 2 + torch.randint(0, 16, (c, h, w), generator=g)
    return zlib.compress(img.clamp(0, 255).to(torch.uint8).numpy().tobytes(), 6)


class SyntheticImages(Dataset):
    """Map-style dataset of (image, label) with real decode and augmentation work."""

    def __init__(self, spec: PresetSpec, seed: int = 0, fail_at: int | None = None) -> None:
        self.spec = spec
        self.seed = seed
        self.fail_at = fail_at  # fault injection: the fail_at-th sample loaded raises
        self.length: int | None = None  # epoch length override (LoaderConfig.epoch_samples)
        self._loaded = 0
        self.payload = _payload(spec.shape, seed)
        self.kernel = torch.full((spec.shape[0], 1, 3, 3), 1.0 / 9.0)

    def __len__(self) -> int:
        return self.length if self.length is not None else self.spec.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        self._loaded += 1
        if self.fail_at is not None and self._loaded >= self.fail_at:
            raise RuntimeError(f"injected fault at sample {self._loaded} (index {index}; "
                               f"{FAULT_ENV} is set)")
        spec = self.spec
        if spec.io_latency_s:
            time.sleep(spec.io_latency_s)
            _read_record(index)
        c, h, w = spec.shape
        raw = zlib.decompress(self.payload)
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(c, h, w).float()
        x.div_(255.0)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        for _ in range(spec.rounds):
            dy, dx = (int(v) for v in torch.randint(0, 5, (2,), generator=g))
            crop = x[:, dy:, dx:]
            crop = F.pad(crop, (0, dx, 0, dy), mode="replicate")
            if bool(torch.rand((), generator=g) < 0.5):
                crop = crop.flip(-1)
            x = F.conv2d(crop.unsqueeze(0), self.kernel, padding=1, groups=c).squeeze(0)
            x = (x - x.mean()) / (x.std() + 1e-6) * 0.25 + 0.5
        return x.contiguous(), index % 10


def worker_init(worker_id: int) -> None:
    """Each worker opens its shard index once (modelled as storage latency)."""
    info = torch.utils.data.get_worker_info()
    spec = getattr(info.dataset, "spec", None) if info is not None else None
    if spec is not None and spec.worker_init_s:
        time.sleep(spec.worker_init_s)


def make_dataset(preset: str, seed: int = 0) -> SyntheticImages:
    """The preset's dataset. ${FAULT_ENV}=N makes the N-th sample each loading process
    fetches raise, to exercise the failure paths."""
    try:
        spec = PRESET_SPECS[preset]
    except KeyError:
        raise ValueError(
            f"unknown preset {preset!r}: choose one of {sorted(PRESET_SPECS)}") from None
    fault = os.environ.get(FAULT_ENV)
    return SyntheticImages(spec, seed, int(fault) if fault else None)
