"""`starvation-monitor doctor`: the environment a training job will meet, checked before it
runs, each line with what to do. torch is asked in a child interpreter (this process never
imports it); the rest is read here: NVML, /dev/shm, process and file limits, the cgroup's
CPU and memory limits, /proc schedstat and io (the measured time split), the store's folder;
and what the CPUs do together is measured (1.2 s of spinning) and kept for the advice.
Each check is a function of what it reads, injected, so tests give it fixtures."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OK, WARN, FAIL = "ok", "warn", "FAIL"
MIN_SHM_MB = 1024  # DataLoader workers pass batches through /dev/shm: Docker's 64 MB fails
MIN_NPROC = 4096  # each worker is a process with threads of its own
MIN_NOFILE = 4096  # workers share tensors through file descriptors


@dataclass(frozen=True, slots=True)
class Check:
    status: str
    what: str
    todo: str = ""

    def line(self) -> str:
        return f"{self.status:>4}  {self.what}" + (f"\n      → {self.todo}" if self.todo else "")


# Asked in the training interpreter: torch's build, and torchvision's version, the torch it
# was built for (its wheel pins one release) and whether it imports beside this torch.
TORCH_PROBE = """
import json, importlib.metadata as md, torch
c = torch.cuda
import multiprocessing
out = {'v': torch.__version__, 'cuda': torch.version.cuda, 'ok': c.is_available(),
       'n': c.device_count() if c.is_available() else 0,
       'start': multiprocessing.get_start_method(allow_none=True)
                or multiprocessing.get_all_start_methods()[0]}
try:
    out['tv'] = md.version('torchvision')
    out['tv_needs'] = [r for r in (md.requires('torchvision') or [])
                       if r.replace(' ', '').startswith('torch==')]
    try:
        import torchvision
    except Exception as exc:
        out['tv_error'] = f'{type(exc).__name__}: {exc}'
except md.PackageNotFoundError:
    pass
print(json.dumps(out))
"""


def torch_check(python: str = sys.executable) -> list[Check]:
    try:
        r = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True,
                           timeout=120)
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return [Check(FAIL, f"torch does not import in {python}",
                      "install torch in the training environment (pip install torch)")]
    out = [vision_check(info)] if info.get("tv") else []
    out.append(start_method_check(info.get("start")))
    if info["ok"]:
        return [Check(OK, f"torch {info['v']}, CUDA {info['cuda']}, {info['n']} device(s)")] \
            + out
    why = "a CPU build" if not info["cuda"] else f"CUDA {info['cuda']} build, no device seen"
    return [Check(WARN, f"torch {info['v']}: {why}",
                  "on a GPU machine install the CUDA build; here the simulated accelerator "
                  "stands in")] + out


def vision_check(info: dict[str, Any]) -> Check:
    """torchvision against the torch beside it: each torchvision wheel is built for one
    torch release, and another torch breaks its import ('operator torchvision::nms does not
    exist'), and with it timm and every script that uses it."""
    torch_v, tv = info["v"], info["tv"]
    pins = [p.replace(" ", "").split(";")[0][len("torch=="):] for p in info.get("tv_needs") or []]
    base = torch_v.split("+")[0]
    mismatch = [p for p in pins if p.split("+")[0] != base]
    if info.get("tv_error") or mismatch:
        needs = f" was built for torch {mismatch[0]}" if mismatch else " does not import"
        return Check(FAIL, f"torchvision {tv}{needs}, and this environment has torch "
                     f"{torch_v}" + (f": {info['tv_error']}" if info.get("tv_error") else ""),
                     "install the pair together, e.g. pip install "
                     + (f"torch=={mismatch[0]} torchvision=={tv}" if mismatch else
                        f"'torchvision' matching torch {base}")
                     + " (starvation-monitor itself never changes your torch)")
    return Check(OK, f"torchvision {tv} matches torch {torch_v}")


def nvml_check(backend: Any) -> list[Check]:
    if not backend.available:
        return [Check(WARN, f"NVML: {backend.notice}", "install the NVIDIA driver and "
                      "nvidia-ml-py for GPU utilization; step timings work without it")]
    devs = backend.devices()
    out = [Check(OK, f"NVML: {len(devs)} GPU(s): " + ", ".join(d.name for d in devs))]
    if devs and not any(d.gpm for d in devs):
        out.append(Check(WARN, "GPM (SM activity) not supported on these GPUs",
                         "utilization is the driver's 'a kernel ran' figure only"))
    return out


def shm_check(total_mb: float | None) -> Check:
    if total_mb is None:
        return Check(WARN, "/dev/shm not found", "DataLoader workers need shared memory")
    if total_mb < MIN_SHM_MB:
        return Check(FAIL, f"/dev/shm is {total_mb:,.0f} MB",
                     "workers will die with 'Bus error' on large batches: run the container "
                     "with --shm-size=8g (or --ipc=host)")
    return Check(OK, f"/dev/shm {total_mb:,.0f} MB")


def in_flight_check(shm_mb: float | None, nofile: int, batch_mb: float, tensors: int,
                    workers: int, prefetch: int) -> list[Check]:
    """A declared loader (--batch-mb, --tensors, --num-workers, --prefetch-factor) against
    /dev/shm and `ulimit -n`, before it runs: the same findings a run's probe report gets
    (monitor/diagnosis/limits.py), from the declared figures instead of a first batch."""
    from monitor.config import in_flight as batches_in_flight
    from monitor.diagnosis import limits

    declared = {"num_workers": workers, "prefetch_factor": prefetch}
    report = {**declared, "in_flight": batches_in_flight(declared), "batch_bytes": batch_mb * 1e6,
              "batch_tensors": tensors, "shm_total_mb": shm_mb, "shm_free_mb": shm_mb,
              "nofile_limit": None if nofile == resource.RLIM_INFINITY else nofile,
              "open_fds": 0, "sharing_strategy": "file_descriptor"}
    in_flight = report["in_flight"] + 1  # and the one the loop holds
    out = []
    if shm_mb is not None:
        f = limits.shm(report)
        out.append(Check(FAIL, f.text, f.advice[-1].reason) if f is not None else Check(
            OK, f"batches in flight need {batch_mb * in_flight:,.0f} MB of /dev/shm "
            f"({in_flight} of {batch_mb:,.1f} MB); {shm_mb:,.0f} MB exist"))
    if tensors and report["nofile_limit"]:
        f = limits.open_files(report)
        out.append(Check(FAIL, f.text, f.advice[0].reason) if f is not None else Check(
            OK, f"descriptors in flight about {tensors * in_flight:,} ({tensors} tensors a "
            f"batch x {in_flight}) against ulimit -n {nofile:,}"))
    return out


def start_method_check(method: str | None) -> Check:
    """The start method workers will use: with spawn or forkserver (Python 3.14's default)
    every worker imports torch and unpickles the dataset object at each epoch unless
    persistent_workers keeps them."""
    if method in (None, "fork"):
        return Check(OK, f"worker start method {method or 'fork'}")
    return Check(WARN, f"worker start method {method}: each worker imports torch and "
                 "unpickles the dataset object when it starts",
                 "set persistent_workers=True so they start once, not every epoch; keep "
                 "the dataset object small (paths, not loaded data)")


def limit_check(name: str, soft: int, minimum: int, todo: str) -> Check:
    if soft != resource.RLIM_INFINITY and soft < minimum:
        return Check(FAIL, f"{name} is {soft}", todo)
    return Check(OK, f"{name} {'unlimited' if soft == resource.RLIM_INFINITY else soft}")


def cgroup_check(budget: Any, mem_limit_mb: float | None) -> list[Check]:
    out = []
    sched = getattr(budget, "scheduler", None)
    if sched is not None:
        over = sched < budget.affinity
        out.append(Check(WARN if over else OK,
                         f"Slurm grants {sched} CPU{'s' if sched != 1 else ''} a task "
                         f"(SLURM_CPUS_PER_TASK) of the {budget.affinity} in its mask",
                         f"the advice keeps this task's workers within {budget.usable} cores;"
                         " ask for more with --cpus-per-task" if over else ""))
    if budget.quota is not None:
        out.append(Check(WARN if budget.quota < budget.affinity else OK,
                         f"cgroup CPU quota {budget.quota:g} cores of {budget.affinity}",
                         "num_workers beyond the quota only wait for a CPU"
                         if budget.quota < budget.affinity else ""))
    else:
        out.append(Check(OK, f"{budget.usable} usable cores (no cgroup CPU quota)"))
    if budget.throttled:
        out.append(Check(WARN, f"cgroup throttled in {budget.throttled:.0%} of periods",
                         "the job hits its CPU quota: raise it or use fewer workers"))
    if mem_limit_mb is not None:
        out.append(Check(OK, f"cgroup memory limit {mem_limit_mb:,.0f} MB"))
    return out


def capacity_check(measured: Any) -> Check:
    """What the usable CPUs do together, measured now and kept for the advice (NOTE [the
    CPUs' capacity] in monitor/sampling/capacity.py), or why it could not be."""
    if isinstance(measured, str):
        return Check(WARN, "the CPUs' capacity: not measured", measured)
    short = measured.cores < measured.usable - 0.25
    return Check(WARN if short else OK,
                 f"{measured.usable} CPUs do {measured.cores:.2f}x one CPU's work together "
                 f"(measured; kept for the advice)",
                 "SMT siblings or shared vCPUs: the advice counts "
                 f"{measured.cores:.2f} cores' worth of loading, not {measured.usable}"
                 if short else "")


def proc_check(available: dict[str, bool]) -> list[Check]:
    out = []
    if available.get("schedstat"):
        out.append(Check(OK, "/proc schedstat: loaders' CPU wait is measured"))
    else:
        out.append(Check(WARN, "no /proc schedstat", "CPU contention cannot be told from "
                         "storage waits: the verdicts say so instead of guessing"))
    if not available.get("io"):
        out.append(Check(WARN, "no /proc/<pid>/io", "reads are not measured: io-bound is "
                         "never claimed"))
    return out


def store_check(path: Path) -> Check:
    folder = path.parent if path.parent.exists() else next(
        (p for p in path.parents if p.exists()), Path("."))
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        return Check(FAIL, f"cannot write the store's folder {folder}",
                     "pass --db with a path in a folder you can write")
    free = shutil.disk_usage(folder).free / 1e6
    if free < 500:
        return Check(WARN, f"store {path}: {free:,.0f} MB free", "free some space or --db "
                     "elsewhere: a long run writes tens of MB an hour")
    return Check(OK, f"store {path} ({free:,.0f} MB free)")


def mem_limit_mb(root: str = "/sys/fs/cgroup") -> float | None:
    try:
        raw = Path(root, "memory.max").read_text().strip()
    except OSError:
        return None
    return None if raw == "max" else int(raw) / 1e6


def run(db: str | None, python: str | None = None, loader: dict[str, Any] | None = None,
        capacity: bool = True) -> list[Check]:
    from monitor.config import prefetch_of
    from monitor.sampling import procfs
    from monitor.sampling.budget import cpu_budget
    from monitor.sampling.gpu import open_backend
    from monitor.store import default_path

    checks = torch_check(python or sys.executable)
    backend = open_backend()
    try:
        checks += nvml_check(backend)
    finally:
        backend.close()
    shm = shutil.disk_usage("/dev/shm").total / 1e6 if os.path.isdir("/dev/shm") else None
    checks.append(shm_check(shm))
    if loader and loader.get("batch_mb"):
        checks += in_flight_check(shm, resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                                  loader["batch_mb"], loader.get("tensors") or 0,
                                  loader.get("num_workers") or 0,
                                  prefetch_of(loader))
    checks.append(limit_check("ulimit -u (processes)", resource.getrlimit(resource.RLIMIT_NPROC)[0],
                              MIN_NPROC, f"raise it (ulimit -u {MIN_NPROC * 4}): each "
                              "DataLoader worker is a process"))
    checks.append(limit_check("ulimit -n (open files)",
                              resource.getrlimit(resource.RLIMIT_NOFILE)[0], MIN_NOFILE,
                              f"raise it (ulimit -n {MIN_NOFILE * 16}), or "
                              "torch.multiprocessing.set_sharing_strategy('file_system')"))
    checks += cgroup_check(cpu_budget(), mem_limit_mb())
    if capacity:
        from monitor.sampling.capacity import measure
        checks.append(capacity_check(measure()))
    checks += proc_check(procfs.available())
    checks.append(store_check(Path(db) if db else default_path()))
    return checks


def doctor_command(args: Any) -> int:
    loader = {"batch_mb": getattr(args, "batch_mb", None),
              "tensors": getattr(args, "tensors", None),
              "num_workers": getattr(args, "num_workers", None),
              "prefetch_factor": getattr(args, "prefetch_factor", None)}
    checks = run(args.db, args.python, loader, not getattr(args, "no_capacity", False))
    for c in checks:
        print(c.line())
    failed = [c for c in checks if c.status == FAIL]
    print(f"{len(checks)} checks, {len(failed)} failing")
    return 1 if failed else 0
