"""What the usable CPUs get done together (NOTE [the CPUs' capacity])."""

# NOTE [the CPUs' capacity]
# k busy tasks on k CPUs do k times one task's work only where each CPU is a core of its
# own. SMT siblings share one core's units (two do about 1.1-1.3x one), and a cloud VM's
# vCPUs are often such siblings on the host, or shared with other VMs. The bound model
# (diagnosis/bound.py) counts the CPU it shares out in units of one task running alone:
# capacity(U) of them for U usable CPUs, and k busy CPUs give cap(k) (bound.capacity_at).
#
# Measured, not read from the CPU count: `starvation-monitor doctor` runs one process
# spinning a fixed loop for MEASURE_S, then U of them at once; capacity = their summed rate
# over the one's. It is kept in the user's cache under the CPUs' model name and the
# affinity set, so a run reads it, never measures (a run must not take the CPUs from its
# own job). A measurement while other processes keep the CPUs busy is refused: it would
# read the neighbours, not the cores. Not measured: the topology in /sys says how many
# cores the usable CPUs sit on (P); siblings beyond them count SMT_YIELD of a core each,
# said as assumed; without siblings, the CPU count.
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from monitor.sampling.procfs import read_text

MEASURE_S = 0.6  # each phase: long enough for a scheduler tick's noise to be < 1%
SMT_YIELD = 0.25  # a sibling thread's extra work over its core alone, where not measured
QUIET_OTHERS = 0.3  # cores: other processes busier than this spoil a measurement
ON_CPU = 0.9  # a spinning process on a CPU less of its time than this waited for one

SPIN = """
import sys, time
start = time.perf_counter()
end = start + float(sys.argv[1])
n = 0
while time.perf_counter() < end:
    for i in range(2000):
        i * i % 7
    n += 1
print(n / (time.perf_counter() - start), time.process_time())
"""


@dataclass(frozen=True, slots=True)
class Capacity:
    """cores: what the `usable` CPUs do together, in units of one task alone; physical:
    the cores they sit on (None: unknown); source: how it is known, in words."""

    cores: float
    usable: int
    physical: int | None
    source: str



def _cpus(affinity: set[int] | None) -> list[int]:
    if affinity is not None:
        return sorted(affinity)
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int], sys_root: str = "/sys") -> int | None:
    """How many cores the CPUs sit on (package, core id), from /sys; None where unread."""
    seen = set()
    for c in cpus:
        base = f"{sys_root}/devices/system/cpu/cpu{c}/topology"
        core, pkg = read_text(f"{base}/core_id"), read_text(f"{base}/physical_package_id")
        if core is None:
            return None
        seen.add(((pkg or "0").strip(), core.strip()))
    return len(seen) or None


def _key(cpus: list[int]) -> str:
    names = [ln.split(":", 1)[1].strip() for ln in (read_text("/proc/cpuinfo") or "")
             .splitlines() if ln.startswith("model name")]
    return f"{names[0] if names else 'cpu'}|{','.join(map(str, cpus))}"


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "starvation-monitor" / "capacity.json"


def capacity(usable: int, affinity: set[int] | None = None, sys_root: str = "/sys",
             cache: Path | None = None) -> Capacity:
    """The measured capacity of these CPUs where `doctor` kept one, else the topology's."""
    cpus = _cpus(affinity)
    phys = physical_cores(cpus, sys_root)
    if phys is not None:
        phys = min(phys, usable)
    try:
        kept = json.loads((cache or cache_path()).read_text()).get(_key(cpus))
    except (OSError, ValueError, AttributeError):
        kept = None
    if kept and int(kept.get("usable", 0)) == len(cpus) and kept.get("cores"):
        cores = min(float(usable), float(kept["cores"]) * usable / len(cpus))
        when = time.strftime("%Y-%m-%d", time.localtime(kept.get("at", 0)))
        return Capacity(cores, usable, phys, f"measured {when}: {len(cpus)} CPUs do "
                        f"{kept['cores']:.2f}x one's work")
    if phys is not None and phys < usable:
        return Capacity(phys + SMT_YIELD * (usable - phys), usable, phys,
                        f"{phys} cores for {usable} CPUs (SMT): {SMT_YIELD:g} of a core "
                        "assumed for each sibling (`starvation-monitor doctor` measures it)")
    return Capacity(float(usable), usable, phys, "the CPU count (not measured)")


def _busy(cpus: list[int]) -> tuple[float, float] | None:
    """(busy, total) jiffies of these CPUs (the affinity set's), from /proc/stat."""
    want = {f"cpu{c}" for c in cpus}
    busy = total = 0.0
    for line in (read_text("/proc/stat") or "").splitlines():
        p = line.split()
        if len(p) >= 5 and p[0] in want:
            v = [float(x) for x in p[1:]]
            idle = v[3] + (v[4] if len(v) > 4 else 0.0)
            busy, total = busy + sum(v) - idle, total + sum(v)
    return (busy, total) if total > 0 else None


def _phase(k: int, seconds: float) -> tuple[float, float, float]:
    """k spinning processes: (their summed rate, the least share of its wall time one of
    them was on a CPU, other processes' busy cores meanwhile)."""
    cpus = _cpus(None)
    before = _busy(cpus)
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)],
                              stdout=subprocess.PIPE, text=True) for _ in range(k)]
    out = [p.communicate()[0].split() for p in procs]
    after = _busy(cpus)
    done = [(float(o[0]), float(o[1])) for o in out if len(o) == 2]
    if len(done) < k:
        return 0.0, 0.0, 0.0
    cpu = sum(t for _, t in done)
    others = 0.0
    if before and after and after[1] > before[1]:
        tick = os.sysconf("SC_CLK_TCK")
        wall = (after[1] - before[1]) / len(cpus) / tick
        others = max(0.0, ((after[0] - before[0]) / tick - cpu) / max(wall, 1e-9))
    return sum(r for r, _ in done), min(t for _, t in done) / seconds, others


def measure(cache: Path | None = None, seconds: float = MEASURE_S) -> Capacity | str:
    """Measure what the usable CPUs do together and keep it; a sentence where the box is
    too busy to tell."""
    cpus = _cpus(None)
    one, on1, o1 = _phase(1, seconds)
    many, onk, ok = _phase(len(cpus), seconds)
    busy = max(o1, ok)
    if busy > QUIET_OTHERS or min(on1, onk) < ON_CPU or one <= 0:
        return (f"other processes kept {busy:.1f} of the {len(cpus)} CPUs busy (a spinning "
                f"process was on a CPU {min(on1, onk):.0%} of its time): the capacity was "
                "not measured; run `starvation-monitor doctor` again on a quieter box")
    cores = min(float(len(cpus)), many / one)
    path = cache or cache_path()
    try:
        kept = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        kept = {}
    kept[_key(cpus)] = {"cores": round(cores, 3), "usable": len(cpus), "at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(kept))
    except OSError:
        pass
    return capacity(len(cpus), cache=path)
