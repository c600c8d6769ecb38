"""Immutable records shared by the probe, the collector, the store and the charts.

One schema drives all of them: each record's fields become the store's columns (with SQL
types from the annotations), and each field's metadata gives the label and unit the charts and
the CLI print.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

_REQUIRED: Any = object()

# The events table's kinds, each named here once (who writes it: who reads it). A config
# event shares its name with the control request of that kind (monitor/control.py).
PROBE = "probe"  # the attach probe's notes on itself: assess/probe_notes.py, the run's JSON
EPOCH = "epoch"  # an epoch began, its worker pids: manage/session.py, assess/window.py
CONFIG = "config"  # the run's settings now (applied): assess/window.py, outcomes, history
EVALUATION = "evaluation"  # an evaluation pass over the training loader: the run's JSON
LOADER = "loader"  # the timed loader's report (its batch's bytes, ...): assess/window.py
WORKERS_READY = "workers ready"  # when each worker's first batch came: assess/window.py
LOADER_ERROR = "loader error"  # an exception the loader raised: assess/window.py, limits
SHM = "shm"  # /dev/shm segments of killed processes removed: the run's events
TRACKER = "tracker"  # what an output could not send to its tracker: the run's events
COMPILE = "compile"  # torch.compile's graphs new since the probe's last look: assess/window.py
SYNCS = "syncs"  # the host's CUDA syncs on a sample of steps (probe/syncs.py): assess/window.py
JUDGED = "judged"  # the verdict's line as a run ended: assess/same_runs.py, for later runs
# Event kinds of the stall watchdog (monitor/probe/watchdog.py writes, assess/stall.py reads).
STALLED, RESUMED = "stalled", "resumed"
STALL_KINDS = (STALLED, RESUMED)
LOOP_ENDED = "the loop ended"  # a resumed event's label when the loop ended in a stall
# the loader report's `built_by` for Lightning's training loop (probe/loops.py names it,
# diagnosis/costs.py advises its own setting for a loader it builds each epoch)
LIGHTNING_FIT = "Lightning's fit loop"
# what the probe appends to a DataLoader worker's death in its loader error's text, the OOM
# kills the kernel counted since the run began (probe/oom_count.py writes, diagnosis/limits.py
# reads: NOTE [who killed the worker])
OOM_NOTE = re.compile(r"; OOM kills since the run began: (\d+) on this host(?:, (\d+) in its "
                      r"cgroup)? \(the kernel's count\)")


def oom_counted(text: str) -> tuple[int, bool] | None:
    """The OOM kills an error's OOM_NOTE says the kernel counted, the cgroup's where it says
    (True) else the host's (False); None where the text says none."""
    got = OOM_NOTE.search(text)
    if got is None:
        return None
    return int(got.group(2) or got.group(1)), got.group(2) is not None


# Where the scheduler put a rank (monitor/probe/identity.py placement writes them to the
# ranks table; the exporter's labels, in this order).
PLACEMENT = ("hpc_job", "pod", "namespace", "replica")


def col(label: str, unit: str = "", default: Any = _REQUIRED) -> Any:
    meta = {"label": label, "unit": unit}
    if default is _REQUIRED:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class StepField:
    """One figure the probe measures per step (STEP_FIELDS)."""

    name: str
    type: str  # "int", "float", "int | None", "float | None" (the store's SQL type)
    label: str
    unit: str = ""

    @property
    def nullable(self) -> bool:
        return self.type.endswith("| None")

    @property
    def integer(self) -> bool:
        return self.type.startswith("int")


# NOTE [a step's fields]
# STEP_FIELDS is the one list of what the probe measures per step, in the order it travels:
# the probe's tuple (monitor/probe/timing.py's record, its one producer), the ring's record
# after its kind slot (monitor/ring.py builds its layout and its per-step `put` from this
# list), the writer's and the relay's rows, and the steps table (StepRecord, made from it
# below with the columns the store adds around it: the run, the rank, the device clock's
# times). A new per-step figure is a line here and its value in the producer's tuple.
# Times are seconds; `ts` is the probe's clock in the tuple and the ring, wall time stored.
STEP_FIELDS: tuple[StepField, ...] = (
    StepField("step", "int", "step"),
    StepField("epoch", "int", "epoch"),
    StepField("ts", "float", "batch received", "s"),  # data wait [ts - wait_s, ts], compute
    StepField("wait_s", "float", "data wait", "s"),  # [ts, ts + compute_s]
    StepField("compute_s", "float", "compute", "s"),
    StepField("samples", "int", "samples in batch"),
    StepField("config_seq", "int", "config generation"),
    StepField("copy_s", "float | None", "host-to-device copy (CUDA)", "s"),
    # DataLoader workers only (monitor/probe/workers.py): the worker that produced the batch,
    # and the batches other workers had finished that the in-order queue held behind it
    StepField("worker", "int | None", "DataLoader worker that produced the batch"),
    StepField("held", "int | None", "finished batches held behind this one (in-order queue)"),
    # ... and the finished batches still queued, not yet received, when this one was: the
    # workers ahead of the loop (a backlog), or not (none: the loop waits for a worker)
    StepField("ready", "int | None", "finished batches queued, unreceived, at the ask"),
    # ... and the loop thread's own time through that receiving (monitor/probe/thread_clock.py;
    # None without workers or with a pinning thread): on a CPU, and runnable but waiting for
    # one (read on one receipt in 16; None where the kernel does not say). NOTE [the loop's
    # receive]
    StepField("wait_cpu_s", "float | None", "the loop thread's CPU in the data wait", "s"),
    StepField("wait_runq_s", "float | None", "the loop thread's wait for a CPU in the data "
              "wait", "s"),
    # the step's phases (monitor/probe/phases.py): device time where device_span_s is set
    # (CUDA events), else host time; None where not measured
    StepField("forward_s", "float | None", "forward pass (outermost modules)", "s"),
    StepField("backward_s", "float | None", "backward pass", "s"),
    StepField("optimizer_s", "float | None", "optimizer step", "s"),
)
STEP_AT = {f.name: i for i, f in enumerate(STEP_FIELDS)}  # a field's place in the tuple
PHASES_AT = STEP_AT["forward_s"]  # forward, backward, optimizer: three in a row
assert [f.name for f in STEP_FIELDS[PHASES_AT:PHASES_AT + 3]] == [
    "forward_s", "backward_s", "optimizer_s"]


def _step_record() -> type:
    """The steps table's record: the run, STEP_FIELDS, then what the store adds (the rank,
    from the writer; the device clock's idle time and span, harvested after the step). Its
    first eight fields are required; every later one defaults (None, or 0)."""
    spec: list[tuple[str, str, Any]] = [("run_id", "int", col("run"))]
    for k, f in enumerate(STEP_FIELDS):
        spec.append((f.name, f.type, col(f.label, f.unit) if k < 7 else
                     col(f.label, f.unit, default=None if f.nullable else 0)))
    spec += [
        ("rank", "int", col("rank (torch.distributed RANK)", default=0)),
        # CUDA only, from events on the training stream (monitor/probe/device_clock.py)
        ("device_idle_s", "float | None",
         col("device idle before the step (CUDA events)", "s", default=None)),
        ("device_span_s", "float | None",
         col("device time of the step (CUDA events)", "s", default=None)),
    ]
    cls = make_dataclass("StepRecord", spec, frozen=True, slots=True, namespace={
        "__doc__": "One training step as the probe saw it (STEP_FIELDS, NOTE [a step's "
                   "fields]). `ts` is the wall-clock time the batch arrived; data wait is "
                   "[ts - wait_s, ts] and compute is [ts, ts + compute_s]."})
    cls.__module__ = __name__
    return cls


StepRecord = _step_record()


@dataclass(frozen=True, slots=True)
class HostSample:
    """Host and workload process tree at one instant (psutil)."""

    ts: float = col("time", "s")
    run_id: int | None = col("run")
    cpu_total_pct: float | None = col("CPU total", "%")
    cpu_per_core: str | None = col("CPU per core (JSON list)", "%")
    mem_used_mb: float | None = col("memory used", "MB")
    mem_total_mb: float | None = col("memory total", "MB")
    mem_available_mb: float | None = col("memory available", "MB")
    shm_used_mb: float | None = col("/dev/shm used", "MB")
    proc_cpu_pct: float | None = col("main process CPU", "%")
    proc_rss_mb: float | None = col("main process RSS", "MB")
    workers: int | None = col("DataLoader workers")
    workers_cpu_pct: float | None = col("workers CPU", "%")
    workers_rss_mb: float | None = col("workers RSS", "MB")
    workers_uss_mb: float | None = col("workers USS", "MB", default=None)
    # Where the loaders' time went since the last pass (/proc schedstat and io; None where
    # the kernel does not say): waiting for a CPU (run queue), % of one core; bytes read
    # from the block device (read_bytes: never the page cache).
    proc_runq_pct: float | None = col("main process CPU wait (run queue)", "%", default=None)
    workers_runq_pct: float | None = col("workers CPU wait (run queue)", "%", default=None)
    workers_reaped_cpu_pct: float | None = col(
        "CPU of workers that exited since the last pass, unsampled", "%", default=None)
    proc_read_kb_s: float | None = col("main process reads from storage (block device)",
                                       "KB/s", default=None)
    workers_read_kb_s: float | None = col("workers' reads from storage (block device)",
                                          "KB/s", default=None)
    # threads that wanted a CPU at least a fifth of the pass: the main process's, and a
    # worker's on average (a library's pool: OpenBLAS, OpenMP, OpenCV; one when none runs)
    proc_busy_threads: float | None = col("main process threads at work", default=None)
    workers_busy_threads: float | None = col("threads at work a worker", default=None)
    rank: int | None = col("rank whose process this row samples (None: the whole tree)",
                           default=None)
    # each worker since the last pass (JSON list of {pid, cpu_pct, rss_mb, uss_mb, status})
    workers_detail: str | None = col("each DataLoader worker (JSON list)", default=None)
    # the memory limit that binds the workload (its cgroup's or an ancestor's; None: none)
    cgroup_mem_limit_mb: float | None = col("cgroup memory limit", "MB", default=None)
    cgroup_mem_used_mb: float | None = col("cgroup memory used", "MB", default=None)
    # the monitor's own processes (its sampler's, a dashboard server's) since the last pass
    monitor_cpu_pct: float | None = col("the monitor's own processes' CPU", "%", default=None)
    # every SCAN_S: the other processes' CPU demand by scheduling group (JSON: the job's own
    # group, and each group's weight, demand, CPU; NOTE [scheduling groups] in
    # monitor/sampling/groups.py)
    others_groups: str | None = col("other processes by scheduling group (JSON)", default=None)
    # the loaders' reads that the block device did not serve (rchar - read_bytes: sockets
    # and the page cache), and the peers of their TCP connections (JSON {peer: count};
    # NOTE [remote reads] in monitor/sampling/sockets.py)
    loaders_net_kb_s: float | None = col("loaders' reads not from storage (sockets, cache)",
                                         "KB/s", default=None)
    loaders_peers: str | None = col("loaders' TCP peers (JSON)", default=None)
    # the busiest, the median and the idlest core of the sample, from cpu_per_core: the
    # three lines a many-core host's chart draws (192 readings parsed a row at each refresh
    # were half of a 5-minute window's; bench/ui_tick.py --cores 192); None in rows stored
    # before they were
    cpu_busiest_core_pct: float | None = col("CPU of the busiest core", "%", default=None)
    cpu_median_core_pct: float | None = col("CPU of the median core", "%", default=None)
    cpu_idlest_core_pct: float | None = col("CPU of the idlest core", "%", default=None)


@dataclass(frozen=True, slots=True)
class GpuUtilSample:
    """One GPU utilization reading at the driver's own time stamp. `source`: "samples"
    (nvmlDeviceGetSamples, every sample of the driver's buffer) or "rates"
    (nvmlDeviceGetUtilizationRates, the fallback when the buffer is empty or unsupported)."""

    ts: float = col("time", "s")
    gpu: int = col("GPU index")
    util_pct: float | None = col("GPU utilization (NVML)", "%")
    source: str = col("NVML source")


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything else about one GPU, once per sampling pass (NVML). Missing: None."""

    ts: float = col("time", "s")
    gpu: int = col("GPU index")
    mem_util_pct: float | None = col("memory-controller utilization (NVML)", "%")
    mem_used_mb: float | None = col("GPU memory used", "MB")
    mem_total_mb: float | None = col("GPU memory total", "MB")
    sm_clock_mhz: float | None = col("SM clock", "MHz")
    power_w: float | None = col("power", "W")
    temp_c: float | None = col("temperature", "°C")
    pcie_rx_mbps: float | None = col("PCIe rx", "MB/s")
    pcie_tx_mbps: float | None = col("PCIe tx", "MB/s")
    sm_active_pct: float | None = col("SM activity (GPM)", "%")
    sm_occupancy_pct: float | None = col("SM occupancy (GPM)", "%")
    proc_sm_pct: float | None = col("workload SM utilization (NVML, per process)", "%")
    proc_mem_pct: float | None = col("workload memory utilization (NVML, per process)", "%")
    lost: int = col("GPU lost (1) or present (0)")


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """The CPUs a workload may really use: `os.cpu_count()` counts the host's cores, which
    overstates what a container may run.

    affinity: cores in this process's CPU affinity mask; quota: cores granted by the cgroup's
    CPU quota (cpu.max, or cfs_quota_us/cfs_period_us on v1), None when unlimited; usable: the
    whole cores that leaves; throttled: the share of CFS periods in which the cgroup was
    throttled so far (None when unknown): high means the quota, not the cores, is the limit;
    scheduler: the CPUs the batch scheduler grants a task (Slurm's SLURM_CPUS_PER_TASK), None
    outside one: a rank's workers must fit it even where no cgroup or mask enforces it;
    capacity: what the usable CPUs do together in units of one task alone, physical: the
    cores they sit on, capacity_source: how that is known (NOTE [the CPUs' capacity] in
    monitor/sampling/capacity.py; None: not read, the CPU count).
    """

    affinity: int
    quota: float | None
    usable: int
    throttled: float | None
    throttled_s: float | None
    scheduler: int | None = None
    capacity: float | None = None
    physical: int | None = None
    capacity_source: str = ""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as NVML sees it; the collector keeps the inventory in the store."""

    index: int  # NVML's index (PCI order), not CUDA's
    name: str
    uuid: str | None  # "GPU-xxxxxxxx-..."
    pci: tuple[int, int, int] | None  # (domain, bus, device)
    mem_total_mb: float | None
    gpm: bool = False  # GPM metrics (Hopper and newer)


RECORD_TABLES: dict[str, type] = {
    "steps": StepRecord,
    "host_samples": HostSample,
    "gpu_samples": GpuSample,
    "gpu_util": GpuUtilSample,
}


def columns(record_type: type) -> list[str]:
    return [f.name for f in fields(record_type)]


def label(record_type: type, name: str) -> str:
    """'memory used (MB)': the field's label with its unit, for axes and tables."""
    for f in fields(record_type):
        if f.name == name:
            unit = f.metadata.get("unit", "")
            return f"{f.metadata['label']} ({unit})" if unit else f.metadata["label"]
    raise KeyError(name)


def sql_type(annotation: str) -> str:
    if annotation.startswith("int"):
        return "INTEGER"
    if annotation.startswith("float"):
        return "REAL"
    return "TEXT"


_GETTERS: dict[type, Any] = {}  # a record type's fields, read at once (attrgetter)


def as_row(record: Any) -> tuple:
    get = _GETTERS.get(type(record))
    if get is None:
        names = [f.name for f in fields(record)]
        get = _GETTERS[type(record)] = operator.attrgetter(*names) if len(names) > 1 else \
            (lambda r, n=names[0]: (getattr(r, n),))
    return get(record)
