"""The kernel's own count of OOM kills, read in the user's process (standard library only):
whether a DataLoader worker that died by SIGKILL was the OOM killer's, or another process's.
"""
from __future__ import annotations

import os
import re

# NOTE [who killed the worker]
# torch says only "DataLoader worker (pid N) is killed by signal: Killed." (or "exited
# unexpectedly") for any SIGKILL: the kernel's OOM killer, a scheduler's preemption or time
# limit, a watchdog, a user's `kill -9`. The memory last sampled cannot tell them apart (a
# worker's last allocation can be made between two samples), and naming the OOM killer for a
# kill it did not make sends a user to shrink a cache that was never the cause. The kernel
# counts each OOM kill it makes: /proc/vmstat's `oom_kill` (every one on the host since boot,
# a cgroup limit's too) and the process's cgroup's own (v2 memory.events.local, v1
# memory.oom_control `oom_kill`: kills of its own processes, and a worker sits in its
# parent's cgroup; not a child cgroup's, which v2's memory.events counts). The recorder (and
# the managed workload, workloads/runner.py) reads both as the run starts and again at a
# death, and says the difference in the loader error's own text (`note`), so that the run's
# reason carries its evidence; monitor/diagnosis/limits.py reads it back (monitor/records.py
# `OOM_NOTE`): none counted is another process's kill, one counted in the job's cgroup (or on
# the host, where the cgroup's count is not there) is the OOM killer's. Two reads of two small
# files, at the start and at a death: no cost while the loop runs.

DEATH = re.compile(r"killed by signal|exited unexpectedly|EOFError|ConnectionResetError|"
                   r"Connection reset by peer")


def _field(path: str, name: str) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value.strip())
    return None


def _cgroup_file(proc: str, root: str) -> str | None:
    """The file of the process's own memory cgroup that counts its OOM kills."""
    try:
        with open(f"{proc}/self/cgroup") as f:
            lines = [ln.rstrip("\n").split(":", 2) for ln in f]
    except OSError:
        return None
    for parts in lines:  # the memory controller on v1 (a hybrid host keeps v2 without it)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            return os.path.join(root, "memory", parts[2].strip("/"), "memory.oom_control")
    for parts in lines:  # v2: its own kills (memory.events counts its children's too)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            d = os.path.join(root, parts[2].strip("/"))
            local = os.path.join(d, "memory.events.local")
            return local if os.path.exists(local) else os.path.join(d, "memory.events")
    return None


def read(proc: str = "/proc", root: str = "/sys/fs/cgroup") -> tuple[int | None, int | None]:
    """(the host's OOM kills since boot, the process's cgroup's); None where not readable."""
    cg = _cgroup_file(proc, root)
    return _field(f"{proc}/vmstat", "oom_kill"), (_field(cg, "oom_kill") if cg else None)


def note(before: tuple[int | None, int | None] | None, error: str,
         now: tuple[int | None, int | None] | None = None) -> str:
    """What to append to a loader error's text: for a worker's death, the OOM kills counted
    since `before` (in monitor/records.py OOM_NOTE's words); '' for any other error, or where
    the count cannot be read."""
    if before is None or not DEATH.search(error):
        return ""
    now = read() if now is None else now
    if before[0] is None or now[0] is None:
        return ""
    host = max(0, now[0] - before[0])
    cg = max(0, now[1] - before[1]) if before[1] is not None and now[1] is not None else None
    where = f", {cg} in its cgroup" if cg is not None else ""
    return f"; OOM kills since the run began: {host} on this host{where} (the kernel's count)"
