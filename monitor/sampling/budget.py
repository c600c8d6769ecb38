"""The CPUs a workload may really use (CpuBudget): the affinity mask, the cgroup's quota,
Slurm's grant, throttling, and what they do together (capacity.py)."""
from __future__ import annotations

import os
from collections.abc import Mapping

from monitor.records import CpuBudget
from monitor.sampling import procfs
from monitor.sampling.capacity import capacity

_read = procfs.read_text


def _stat_fields(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs granted by the cgroup's CPU quota (v2 cpu.max, else v1), or None when unlimited."""
    v2 = _read(os.path.join(root, "cpu.max"))
    if v2 is not None:
        try:
            quota, period = v2.split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except ValueError:
            return None
    q = _read(os.path.join(root, "cpu", "cpu.cfs_quota_us"))
    p = _read(os.path.join(root, "cpu", "cpu.cfs_period_us"))
    try:
        quota_us, period_us = int(q or ""), int(p or "")
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


CGROUP_ROOT = "/sys/fs/cgroup"


def scheduler_cpus(env: Mapping[str, str] | None = None) -> int | None:
    """The CPUs Slurm grants each task of the step (`--cpus-per-task`), None outside Slurm
    or where it is not set (Slurm then grants one CPU a task, and binds it where the task
    affinity plugin runs: the mask says so)."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return None
    try:
        n = int(env.get("SLURM_CPUS_PER_TASK", ""))
    except ValueError:
        return None
    return n if n > 0 else None


def cpu_budget(root: str = CGROUP_ROOT, affinity: int | None = None,
               env: Mapping[str, str] | None = None) -> CpuBudget:
    """Affinity, cgroup quota, the scheduler's grant and throttling (v2 cpu.stat, else v1
    cpu/cpu.stat): usable is the least of the three; and what they do together (capacity,
    read for this host's own cgroup root only: a fixture's has no CPUs of its own)."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    sched = scheduler_cpus(env)
    usable = max(1, min(affinity, int(quota + 0.999)) if quota is not None else affinity)
    usable = max(1, min(usable, sched)) if sched is not None else usable
    stat = _stat_fields(_read(os.path.join(root, "cpu.stat")))
    throttled_s = stat["throttled_usec"] / 1e6 if "throttled_usec" in stat else None
    if not stat:
        stat = _stat_fields(_read(os.path.join(root, "cpu", "cpu.stat")))
        if "throttled_time" in stat:
            throttled_s = stat["throttled_time"] / 1e9
    periods, thr = stat.get("nr_periods"), stat.get("nr_throttled")
    throttled = thr / periods if periods and thr is not None else None
    cap = capacity(usable) if root == CGROUP_ROOT else None
    return CpuBudget(affinity, quota, usable, throttled, throttled_s, sched,
                     cap.cores if cap else None, cap.physical if cap else None,
                     cap.source if cap else "")


def usable_cores(root: str = "/sys/fs/cgroup") -> int:
    return cpu_budget(root).usable
