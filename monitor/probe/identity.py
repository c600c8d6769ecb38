"""Who this training process is, read from its environment and its own torch (never
initialising CUDA): its rank in a torch.distributed job, the job it belongs to, its CUDA
device as NVML can match it, and whether its step runs on CUDA. Standard library only: it
runs inside the user's script with the probe (monitor/probe/patch.py)."""
from __future__ import annotations

import os
import socket
import sys
from typing import Any

from monitor.records import PLACEMENT


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


def _dist() -> Any:
    """torch.distributed when the script has imported and initialised it, else None."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist if dist is not None and dist.is_available() and dist.is_initialized() \
            else None
    except Exception:  # a half-built distributed setup is the script's to report
        return None


def rank_identity(env: dict[str, str] | None = None,
                  dist: Any = None) -> tuple[int, int | None, int]:
    """(rank, local rank, world size) of this process in a torch.distributed job, from
    every launcher: `RANK` (torchrun, torch.distributed.launch, SLURM wrappers; a Kubeflow
    pod's RANK counts pods, and torchrun inside the pod writes its own over it); else the
    script's initialised torch.distributed; else `NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK`
    (Lightning's own DDP launcher sets LOCAL_RANK, NODE_RANK and WORLD_SIZE, not RANK); else
    Slurm's own, for `srun` with no torchrun (SLURM_PROCID, SLURM_LOCALID of
    SLURM_STEP_NUM_TASKS); (0, None, 1) for a single process. `dist` is injected by tests."""
    env = dict(os.environ) if env is None else env

    def num(*keys: str) -> int | None:
        for key in keys:
            try:
                return int(env[key])
            except (KeyError, ValueError):
                continue
        return None

    local, world = num("LOCAL_RANK"), num("WORLD_SIZE")
    rank = num("RANK")
    dist = dist if dist is not None else (_dist() if rank is None else None)
    if rank is None and dist is not None:
        try:
            rank, world = int(dist.get_rank()), world or int(dist.get_world_size())
        except Exception:
            rank = None
    if rank is None and local is not None:
        node = num("NODE_RANK", "GROUP_RANK") or 0
        per_node = num("LOCAL_WORLD_SIZE")
        if node == 0 or per_node:
            rank = node * (per_node or 0) + local
    if rank is None and local is None and (num("SLURM_STEP_NUM_TASKS") or 0) > 1:
        # `srun python train.py`: Slurm started every rank itself, one task each (a batch
        # script's own step has one task: its SLURM_PROCID 0 of SLURM_NTASKS is no rank)
        rank, local = num("SLURM_PROCID"), num("SLURM_LOCALID")
        world = world or num("SLURM_STEP_NUM_TASKS")
    return rank or 0, local, world or 1


def node_rank(env: dict[str, str] | None = None) -> int | None:
    """This host's place among the job's nodes (NODE_RANK, else torchrun's GROUP_RANK, else
    Slurm's SLURM_NODEID for srun's own tasks)."""
    env = dict(os.environ) if env is None else env
    for key in ("NODE_RANK", "GROUP_RANK"):
        if env.get(key, "").isdigit():
            return int(env[key])
    if env.get("SLURM_NODEID", "").isdigit() and not env.get("LOCAL_RANK"):
        return int(env["SLURM_NODEID"])  # srun's tasks: the node's index in the step
    return None


def node_count(env: dict[str, str] | None = None) -> int | None:
    """How many nodes the job spans: torchrun's GROUP_WORLD_SIZE, else WORLD_SIZE over
    LOCAL_WORLD_SIZE; None when the launcher does not say."""
    env = dict(os.environ) if env is None else env
    try:
        if env.get("GROUP_WORLD_SIZE"):
            return int(env["GROUP_WORLD_SIZE"])
        if env.get("SLURM_STEP_NUM_NODES") and not env.get("LOCAL_RANK"):
            return int(env["SLURM_STEP_NUM_NODES"])
        world, local = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
        return max(1, world // local) if local > 0 else None
    except (KeyError, ValueError):
        return None


JOB_ENV = "STARVATION_MONITOR_JOB_ID"  # the user's own name for a job, on every node


def job_id(env: dict[str, str] | None = None) -> str | None:
    """The same on every node of one job, so that each node's series join in Prometheus:
    $STARVATION_MONITOR_JOB_ID; else torchrun's rendezvous id (TORCHELASTIC_RUN_ID, from
    --rdzv-id; "none" under a static rendezvous is no id); else the scheduler's job
    (SLURM_JOB_ID); else the rendezvous address MASTER_ADDR:MASTER_PORT (a later job on the
    same master and port gets the same id: told apart by run_id and time). None for a
    single process outside any of these."""
    env = dict(os.environ) if env is None else env
    for key in (JOB_ENV, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        v = (env.get(key) or "").strip()
        if v and v.lower() != "none":
            return v
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return None


K8S_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def placement(env: dict[str, str] | None = None,
              namespace_file: str = K8S_NAMESPACE_FILE) -> dict[str, str]:
    """Where the scheduler put this process, for the joins with dcgm-exporter's series:
    `hpc_job` (Slurm's SLURM_JOB_ID, as dcgm-exporter's Slurm job mapping labels a GPU), and
    in a Kubernetes pod its `pod` (POD_NAME from the downward API, else the pod's own
    HOSTNAME), `namespace` (POD_NAMESPACE, else the service account's namespace file) and
    `replica` (JOB_COMPLETION_INDEX: an indexed Job's, a JobSet's). Only what is set."""
    env = dict(os.environ) if env is None else env
    out = {"hpc_job": env.get("SLURM_JOB_ID", "")}
    if env.get("KUBERNETES_SERVICE_HOST") or env.get("POD_NAME"):
        out["pod"] = env.get("POD_NAME") or env.get("HOSTNAME", "")
        ns = env.get("POD_NAMESPACE", "")
        if not ns:
            try:
                with open(namespace_file, encoding="utf-8") as f:
                    ns = f.read().strip()
            except OSError:
                ns = ""
        out["namespace"] = ns
        out["replica"] = env.get("JOB_COMPLETION_INDEX", "")
    return {k: out[k].strip() for k in PLACEMENT if out.get(k, "").strip()}


def where(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The rank's place in the job and on the cluster, as Store.set_rank takes it."""
    return {"job_id": job_id(env), "node_rank": node_rank(env), "nodes": node_count(env),
            "placement": placement(env) or None}


def job_key() -> str | None:
    """What the ranks of one job on this host share, under a torch.distributed launcher
    (the job's id, and this host); None for a single process."""
    if rank_identity()[2] <= 1:
        return None
    return f"job:{job_id() or ''}@{socket.gethostname()}"


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
