"""Which NVML device a run's CUDA device is: from what its probe reported (uuid, PCI
location, CUDA index under CUDA_VISIBLE_DEVICES) and the inventory the sampler wrote."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.records import GpuDevice


def _norm_uuid(u: Any) -> str:
    s = str(u).strip().lower()
    return s[4:] if s.startswith("gpu-") else s


def resolve_device(
    devices: Sequence[GpuDevice],
    uuid: str | None = None,
    pci: Sequence[int] | None = None,
    cuda_index: int | None = None,
    cuda_visible: str | None = None,
) -> int | None:
    """The NVML index of the GPU a workload's CUDA device is, or None if unknown.

    CUDA numbers devices fastest-first within CUDA_VISIBLE_DEVICES, NVML in PCI order, so
    the indices differ: match by UUID, then by PCI (domain, bus, device), and only then by
    CUDA_VISIBLE_DEVICES (entries as NVML indices or UUID prefixes) and the CUDA index.
    """
    if uuid:
        want = _norm_uuid(uuid)
        for d in devices:
            if d.uuid and _norm_uuid(d.uuid) == want:
                return d.index
    if pci is not None:
        for d in devices:
            if d.pci is not None and tuple(d.pci) == tuple(pci):
                return d.index
    if cuda_index is None:
        return None
    if cuda_visible:
        entries = [e.strip() for e in cuda_visible.split(",") if e.strip()]
        if cuda_index >= len(entries):
            return None
        entry = entries[cuda_index]
        if entry.isdigit():
            idx = int(entry)
            return idx if any(d.index == idx for d in devices) else None
        want = _norm_uuid(entry)
        hits = [d.index for d in devices if d.uuid and _norm_uuid(d.uuid).startswith(want)]
        return hits[0] if len(hits) == 1 else None
    return cuda_index if any(d.index == cuda_index for d in devices) else None


def workload_gpu(devices: Sequence[GpuDevice], device: dict | None) -> int | None:
    """The NVML index of a run's CUDA device, from what the workload reported (runs.device)."""
    if not device:
        return None
    return resolve_device(devices, uuid=device.get("uuid"), pci=device.get("pci"),
                          cuda_index=device.get("cuda_index"),
                          cuda_visible=device.get("cuda_visible_devices"))


def run_gpu_samples(store: Any, run: dict[str, Any], start: float, end: float
                    ) -> tuple[int | None, Any] | None:
    """(the run's NVML index or None where not known, NVML's utilisation rows over [start,
    end], that GPU's where known); None without NVML."""
    available, _, devices = store.gpu_inventory()
    if not available:
        return None
    dev = workload_gpu(devices, run.get("device"))
    util = store.gpu_util(start, end)
    return dev, util[util["gpu"] == dev] if dev is not None else util


def window_gpu_util(store: Any, run: dict[str, Any], start: float, end: float
                    ) -> float | None:
    """NVML's utilisation (0..100, mean) of the run's GPU over [start, end]: None without
    NVML, without its samples there, or when the run's GPU is not known and the machine has
    more than one (another job's would be read)."""
    try:
        got = run_gpu_samples(store, run, start, end) if end > start else None
        if got is None:
            return None
        dev, util = got
        if dev is None and util["gpu"].nunique() > 1:
            return None
        return float(util["util_pct"].mean()) if len(util) else None
    except Exception:  # the utilisation is extra evidence
        return None
