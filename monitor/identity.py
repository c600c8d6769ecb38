"""Who this training process is, read from its environment and its own torch (never
initialising CUDA): its rank in a torch.distributed job, the job it belongs to, its CUDA
device as NVML can match it, and whether its step runs on CUDA. Standard library only: it
runs inside the user's script with the probe (monitor/attach.py)."""
from __future__ import annotations

import os
import socket
import sys
from typing import Any


def accelerator_kind() -> str:
    """"cuda" when the script uses (or can use) CUDA, else "cpu": its step is real either
    way, never simulated. Read from torch only if the script imported it."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and (cuda.is_initialized() or cuda.is_available()):
            return "cuda"
    except Exception:  # a broken CUDA install is the script's to report, not ours
        pass
    return "cpu"


def rank_identity(env: dict[str, str] | None = None) -> tuple[int, int | None, int]:
    """(rank, local rank, world size) from the torch.distributed environment that torchrun
    and other launchers set; (0, None, 1) for a single process."""
    env = dict(os.environ) if env is None else env
    def num(key: str) -> int | None:
        try:
            return int(env[key])
        except (KeyError, ValueError):
            return None
    return num("RANK") or 0, num("LOCAL_RANK"), num("WORLD_SIZE") or 1


def job_key() -> str | None:
    """What the ranks of one job on this host share, under a torch.distributed launcher:
    torchrun's run id, else the rendezvous address; None for a single process."""
    if rank_identity()[2] <= 1:
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID") or \
        f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return f"job:{run}@{socket.gethostname()}"


def cuda_device() -> dict[str, Any] | None:
    """This process's CUDA device as NVML can match it (uuid, PCI location, CUDA index and
    CUDA_VISIBLE_DEVICES), or None without CUDA in use. Never initialises CUDA itself."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        idx = cuda.current_device()
        p = cuda.get_device_properties(idx)
        uuid = getattr(p, "uuid", None)
        pci = [getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        return {"cuda_index": idx, "uuid": f"GPU-{uuid}" if uuid is not None else None,
                "pci": pci if None not in pci else None,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    except Exception:  # the script's CUDA is the script's business
        return None
