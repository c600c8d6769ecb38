"""`/metrics` for Prometheus: a prometheus-client custom collector over the store (no
hand-written text). NOTE [scrape from a snapshot] below.

Names follow Prometheus conventions: one prefix (`starvation_`), base units (`_seconds`,
`_bytes`, ratios 0-1, `_total` for counters). Run series are per rank, labelled RUN_LABELS
(`run_id`, `job_id`, `rank`, `local_rank`, `node_rank`, `hostname`, the rank's `gpu` and
`UUID`, and the scheduler's `hpc_job`, `pod`, `namespace`, `replica` where set); GPU
series carry `gpu`, `UUID` and `hostname`, spelled as dcgm-exporter spells them, so
`on(hostname, gpu)` joins ours with `DCGM_FI_DEV_GPU_UTIL`. No step numbers or PIDs as
labels; an ended run ages out after RECENT_S. The data-wait share over any window is
`rate(starvation_data_wait_seconds_total[w]) / rate(starvation_step_seconds_total[w])`.

A snapshot is built with its own SQLite connection (WAL: readers never block the
workload's writes), closed before it returns. See METRICS for the list.
"""

# NOTE [scrape from a snapshot]
# Served (`serve`), a scrape reads the counters first (Prometheus stamps them with its
# start), then every other family, each rank's recent window assessed (its verdict, cause,
# wait and busy gauges) at most every ASSESS_S and reused between: an assessment took 10-35
# ms a rank, so assessing at every scrape took 131 ms of CPU a scrape at 8 ranks (13% of a
# core at a 1 s scrape interval; bench/scrape_cost.py). monitor/export/metrics_http.py also
# has a loop (Snapshots.keep_fresh) that builds the snapshot just before each scrape is due,
# so that a scrape only renders the counters (2.5 ms at 8 ranks); it is not started: with it,
# tests/test_cluster.py's two-node job read a PromQL throughput 9-17% under the stores' on
# a quiet box in 5 of 6 runs (142-148 against 156-167 samples/s), and 0 of 3 with each
# scrape building its own snapshot (the loop running or not), for a reason not yet found:
# the counters were read at the scrape in both. Find it before starting the loop. A
# collector that is not served (a test's registry, a one-off text) assesses every time.

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)

from monitor.assess.devices import workload_gpu
from monitor.assess.recent import read_recent, steady_verdict
from monitor.assess.window import Assessment, Context, Window, assess
from monitor.config import LIVE_SETTINGS, LOADER_SETTINGS
from monitor.diagnosis import VERDICTS
from monitor.diagnosis.causes import CAUSES
from monitor.export.metrics_http import Exporter, Snapshots, start
from monitor.frames.analysis import rank_rows, run_rows, workers_memory_mb
from monitor.records import PLACEMENT
from monitor.store import ATTACHED, RUNNING, Store
from monitor.thresholds import KPI_WINDOW_S

PREFIX = "starvation_"
RECENT_S = 300.0  # ended runs stay exported this long, so their last increments are scraped
ASSESS_S = 5.0  # a served rank's window is assessed this often (NOTE [scrape from a snapshot])
# One series per rank of a run. `job_id` is the same on every node of one job (the probe's
# monitor/probe/identity.py job_id); `gpu` and `UUID` are the rank's GPU as dcgm-exporter
# labels it (empty on a CPU rank), so `* on(hostname, gpu) group_left` joins DCGM's series.
# Not `job`: Prometheus renames a target's `job` label to `exported_job`.
# `hpc_job`, `pod`, `namespace`, `replica`: where the scheduler put the rank (PLACEMENT in
# monitor/records.py, read by monitor/probe/identity.py placement; empty, so absent,
# outside Slurm and Kubernetes), for the joins with dcgm-exporter's series by Slurm job or
# pod (docs/cluster.md).
RUN_LABELS = ["run_id", "job_id", "rank", "local_rank", "node_rank", "hostname", "gpu", "UUID",
              *PLACEMENT]
GPU_LABELS = ["gpu", "UUID", "hostname"]
MB = 1024 * 1024
_R = ", ".join(RUN_LABELS)
_KPI = f"{KPI_WINDOW_S:g} s"  # the page's KPI window, the gauges' span

# name, type, labels, meaning: docs/cluster.md's table is written from this list.
NO_CAUSE = "none"  # the cause state where no finding holds
COUNTERS = ("steps", "samples", "data_wait_seconds", "compute_seconds", "step_seconds")

METRICS: list[tuple[str, str, str, str]] = [
    ("steps_total", "counter", _R, "training steps recorded"),
    ("samples_total", "counter", _R, "samples in those steps"),
    ("data_wait_seconds_total", "counter", _R,
     "seconds blocked in next(iterator) waiting for batches"),
    ("compute_seconds_total", "counter", _R,
     "seconds from a batch's arrival to the next request (the step)"),
    ("step_seconds_total", "counter", _R,
     "data wait + compute: the denominator of the data-wait share"),
    ("wait_per_step_seconds", "gauge", _R,
     "mean data wait per step over the last " + _KPI + ": the input-straggler signal"),
    ("device_busy_ratio", "gauge", _R,
     "device busy (step-derived) over the last " + _KPI + ", 0-1"),
    ("verdict", "stateset", _R + ", starvation_verdict",
     "the rank's diagnosis of the last " + _KPI + ": 1 for the current verdict, 0 for the others"),
    ("cause", "stateset", _R + ", starvation_cause",
     "the cause the rank's verdict names over the last " + _KPI + " (its finding: "
     "head-of-line, shm-exhausted, ...; none where no finding holds): 1 for the current one"),
    ("loader_info", "info", ", ".join((_R, *LOADER_SETTINGS)), "the loader settings in force"),
    ("run_info", "info", _R + ", name, kind, status, accelerator_kind, world_size",
     "what the run is; world_size: the job's ranks on every node"),
    ("workers", "gauge", _R, "live DataLoader worker processes"),
    ("workers_cpu_cores", "gauge", _R, "CPU used by the workers, in cores (1 = one core busy)"),
    ("main_process_cpu_cores", "gauge", _R, "CPU used by the training process itself, in cores"),
    ("workers_memory_bytes", "gauge", _R,
     "memory the workers add (USS; RSS where USS is not read)"),
    ("main_process_memory_bytes", "gauge", _R, "RSS of the training process"),
    ("gpu_utilization_ratio", "gauge", "gpu, UUID, hostname",
     "NVML utilization, last sample, 0-1 (DCGM_FI_DEV_GPU_UTIL / 100)"),
    ("gpu_memory_used_bytes", "gauge", "gpu, UUID, hostname",
     "GPU memory used (DCGM_FI_DEV_FB_USED x 2^20)"),
    ("gpu_power_watts", "gauge", "gpu, UUID, hostname", "board power (DCGM_FI_DEV_POWER_USAGE)"),
]
DOC = {name: meaning for name, _, _, meaning in METRICS}
HOST_GAUGES = (("workers", "workers", 1.0), ("workers_cpu_cores", "workers_cpu_pct", 0.01),
               ("main_process_cpu_cores", "proc_cpu_pct", 0.01),
               ("workers_memory_bytes", "workers_uss_mb", MB),
               ("main_process_memory_bytes", "proc_rss_mb", MB))


def _fam(kind: type, name: str, labels: list[str], **kw: Any) -> Any:
    """A family; counters and infos are named without the suffix the client adds."""
    doc = DOC.get(name) or DOC.get(f"{name}_total") or DOC[f"{name}_info"]
    return kind(PREFIX + name, doc, labels=labels, **kw)


def _text(v: Any) -> str:
    """A label value: '' for what is not known."""
    if v is None or (isinstance(v, float) and v != v):
        return ""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


@dataclass(frozen=True, slots=True)
class Counted:
    """The runs shown and their ranks' counter series: (run, rank), labels, the run's
    start."""

    runs: list[int]
    ranks: list[tuple[tuple[int, int], list[str], float]]


@dataclass(frozen=True, slots=True)
class RankSeries:
    """One rank of a run as the exporter labels it."""

    rank: int
    labels: list[str]
    config: dict[str, Any]
    world_size: int


class StoreCollector:
    """The registry's collector: every series from the store, read at each collect (served,
    at each snapshot's build: `serve`)."""

    def __init__(self, db: str, ctx: Context, hostname: str | None = None,
                 assess_every: float = 0.0) -> None:
        self.db, self.ctx = db, ctx
        self.held: dict[tuple[int, int], dict] = {}  # (run, rank) -> its verdict's hysteresis
        self.lock = threading.Lock()  # scrapes run on the HTTP server's threads
        self.hostname = hostname or socket.gethostname()
        # the counters, kept between scrapes and added to from the rows past each run's
        # mark: a scrape reads the steps since the last one, not every step of the run
        self.totals: dict[tuple[int, int], dict[str, Any]] = {}
        self.marks: dict[int, int] = {}  # run -> the last steps rowid counted
        self.totals_lock = threading.Lock()
        self.assess_every = assess_every  # 0: each build assesses each rank
        self.counter_store: Store | None = None
        self.assessed: dict[tuple[int, int], tuple[float, Any, Assessment]] = {}
    def describe(self) -> list[Metric]:
        return []  # families vary with the store; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        counted, families = self.families()
        yield from self.counters(counted)
        yield from families

    def families(self) -> tuple[Counted, list[Metric]]:
        """Every family but the counters from the store now, and the ranks whose counters
        a scrape reads (a served exporter's snapshot is built with it)."""
        store = Store(self.db)
        try:
            counted, families = self._runs(store)
            return counted, [*families, *self._gpus(store)]
        finally:
            store.close()

    def counters(self, counted: Counted) -> list[Metric]:
        """The counter families of the ranks `counted`, their sums read now: a counter is
        read at its scrape, whose time Prometheus stamps it with (rate() needs that)."""
        fams = {n: _fam(CounterMetricFamily, n, RUN_LABELS) for n in COUNTERS}
        if counted.runs:
            if self.counter_store is None:  # opened once: a scrape opens a connection only
                self.counter_store = Store(self.db)
            try:
                totals = self._totals(self.counter_store, counted.runs)
            finally:
                self.counter_store.close()  # (this thread's connection)
            for key, labels, started_at in counted.ranks:
                t = totals.get(key, {})
                # counted from the rank's first step: a young rank's rate reads its own
                # age (monitor/export/promql.py throughput)
                created = float(t.get("first_ts") or started_at)
                for name, fam in fams.items():
                    fam.add_metric(labels, float(t.get(name, 0.0)), created=created)
        return list(fams.values())

    def ranks_of(self, store: Store, run: dict, devices: list,
                 stepped: bool = True) -> list[RankSeries]:
        """The run's ranks as they reported themselves; a run with none is rank 0 of one,
        except a script whose probe has not said who it is and has no steps: no series yet."""
        rid = str(run["id"])
        df = store.ranks(int(run["id"]))
        if df.empty and run.get("kind") == ATTACHED and not stepped:
            return []
        if df.empty:
            gpu = workload_gpu(devices, run.get("device"))
            return [RankSeries(0, [rid, "", "0", "", "", self.hostname, _text(gpu),
                                   self._uuid(devices, gpu), *([""] * len(PLACEMENT))],
                               run.get("config") or {}, 1)]
        out = []
        for r in df.itertuples():
            gpu = workload_gpu(devices, r.device) if r.device else None
            out.append(RankSeries(int(r.rank), [
                rid, _text(getattr(r, "job_id", None)), str(int(r.rank)), _text(r.local_rank),
                _text(getattr(r, "node_rank", None)), _text(r.hostname) or self.hostname,
                _text(gpu), self._uuid(devices, gpu),
                *(str((getattr(r, "placement", None) or {}).get(k, "")) for k in PLACEMENT)],
                r.config or run.get("config") or {}, int(r.world_size or 1)))
        return out

    @staticmethod
    def _uuid(devices: list, gpu: int | None) -> str:
        return next((d.uuid or "" for d in devices if gpu is not None and d.index == gpu), "")

    def _runs(self, store: Store) -> tuple[Counted, list[Metric]]:
        now = time.time()
        runs = store.runs(limit=200)
        runs = runs[(runs["status"] == RUNNING) | (runs["ended_at"] >= now - RECENT_S)]
        counted = Counted([int(r) for r in runs["id"]], [])
        gauges = {n: _fam(GaugeMetricFamily, n, RUN_LABELS) for n in (
            "wait_per_step_seconds", "device_busy_ratio", *(g for g, _, _ in HOST_GAUGES))}
        verdict = _fam(StateSetMetricFamily, "verdict", RUN_LABELS)
        cause = _fam(StateSetMetricFamily, "cause", RUN_LABELS)
        loader = _fam(InfoMetricFamily, "loader", RUN_LABELS)
        info = _fam(InfoMetricFamily, "run", RUN_LABELS)
        totals = self._totals(store, [int(r) for r in runs["id"]])
        devices = store.gpu_inventory()[2]
        for row in runs.itertuples():
            run = store.run(int(row.id)) or {}
            ranks = self.ranks_of(store, run, devices, any(k[0] == int(row.id)
                                                           for k in totals)) if run else []
            if not ranks:
                continue
            end = min(now, run["ended_at"]) if run.get("status") != RUNNING else now
            # every rank assessed within assess_every: only its host rows are read
            fresh = all(self._assessed((int(row.id), rs.rank), rs.config, now) for rs in ranks)
            recent = read_recent(store, int(run["id"]), end) if not fresh else None
            host = run_rows(store.host_samples(end - KPI_WINDOW_S, end), int(row.id)) \
                if fresh else None
            for rs in ranks:
                counted.ranks.append(((int(row.id), rs.rank), rs.labels, float(row.started_at)))
                if recent is not None or fresh:
                    self._recent(recent.window(rs.rank) if recent is not None else None,
                                 (int(row.id), rs.rank), rs.config, now, rs.labels, gauges,
                                 (verdict, cause), rank_rows(host, rs.rank) if fresh else None)
                cfg = rs.config
                loader.add_metric(rs.labels, {k: str(cfg.get(k)) for k in LOADER_SETTINGS})
                info.add_metric(rs.labels, {
                    "name": str(row.name), "kind": str(row.kind), "status": str(row.status),
                    "accelerator_kind": str(run.get("accelerator_kind")),
                    "world_size": str(rs.world_size)})
        with self.lock:  # the runs no longer shown: their verdicts are let go
            shown = {int(i) for i in runs["id"]}
            self.held = {k: v for k, v in self.held.items() if k[0] in shown}
            self.assessed = {k: v for k, v in self.assessed.items() if k[0] in shown}
        return counted, [*gauges.values(), verdict, cause, loader, info]

    def _totals(self, store: Store, run_ids: list[int]) -> dict[tuple[int, int], dict]:
        """Each exported run's counters per rank: the sums kept, plus the new rows' (one
        scrape at a time: two reading the same rows would count them twice)."""
        with self.totals_lock:
            shown = set(run_ids)
            self.totals = {k: v for k, v in self.totals.items() if k[0] in shown}
            self.marks = {r: m for r, m in self.marks.items() if r in shown}
            new = store.rank_totals(run_ids, after=self.marks)
            for key, t in new.items():
                mine = self.totals.setdefault(key, {**t, "steps": 0, "samples": 0,
                                                    "data_wait_seconds": 0.0,
                                                    "compute_seconds": 0.0,
                                                    "step_seconds": 0.0})
                for k in ("steps", "samples", "data_wait_seconds", "compute_seconds",
                          "step_seconds"):
                    mine[k] += t[k]
                first = [x for x in (mine["first_ts"], t["first_ts"]) if x is not None]
                mine["first_ts"] = min(first) if first else None
                self.marks[key[0]] = max(self.marks.get(key[0], 0), t["last_row"])
            return {k: dict(v) for k, v in self.totals.items()}

    def _assessed(self, key: tuple[int, int], config: dict, now: float) -> Assessment | None:
        """The rank's assessment if it is younger than `assess_every`, its settings the
        same."""
        seq = (key, tuple(str(config.get(k)) for k in LIVE_SETTINGS))
        with self.lock:
            got = self.assessed.get(key)
        return got[2] if got is not None and got[1] == seq and \
            now - got[0] < self.assess_every else None

    def _recent(self, w: Window | None, key: tuple[int, int], config: dict, now: float,
                labels: list[str], gauges: dict, verdicts: tuple[Any, Any],
                host: Any = None) -> None:
        """One rank's gauges and verdict over its last 10 s (the page's KPI window); the
        verdict held as the page's banner holds it (assess/recent.py steady_verdict). An
        assessment younger than `assess_every` with the same settings is used again (then
        `w` may be None, and `host` holds the rank's host rows of the window)."""
        seq = (key, tuple(str(config.get(k)) for k in LIVE_SETTINGS))
        a = self._assessed(key, config, now)
        if a is None:
            if w is None:
                return
            a = assess(w, self.ctx)
            with self.lock:
                self.assessed[key] = (now, seq, a)
        f = a.features
        if f.steps:
            gauges["device_busy_ratio"].add_metric(labels, f.device_busy_mean)
            gauges["wait_per_step_seconds"].add_metric(labels, f.wait_per_step_s)
        with self.lock:
            shown, _ = steady_verdict(self.held, key, a, seq, now)
        verdict, cause = verdicts
        verdict.add_metric(labels, {v: v == shown.verdict for v in VERDICTS})
        named = shown.diagnosis.cause or NO_CAUSE
        cause.add_metric(labels, {c: c == named for c in (*CAUSES, NO_CAUSE)})
        host = w.host if w is not None else host
        if host is not None and not host.empty:
            last = host.iloc[-1]
            for name, col, scale in HOST_GAUGES:
                v = workers_memory_mb(host).iloc[-1] if col == "workers_uss_mb" \
                    else last.get(col)
                if v is not None and v == v:
                    gauges[name].add_metric(labels, float(v) * scale)

    def _gpus(self, store: Store) -> Iterator[Metric]:
        available, _, devices = store.gpu_inventory()
        if not available or not devices:
            return
        util = _fam(GaugeMetricFamily, "gpu_utilization_ratio", GPU_LABELS)
        mem = _fam(GaugeMetricFamily, "gpu_memory_used_bytes", GPU_LABELS)
        power = _fam(GaugeMetricFamily, "gpu_power_watts", GPU_LABELS)
        since = time.time() - 30.0
        u, s = store.gpu_util(since), store.gpu_samples(since)
        for d in devices:
            labels = [str(d.index), d.uuid or "", self.hostname]
            du = u[u["gpu"] == d.index]["util_pct"].dropna() if not u.empty else u
            if len(du):
                util.add_metric(labels, float(du.iloc[-1]) / 100.0)
            ds = s[s["gpu"] == d.index] if not s.empty else s
            if len(ds):
                last = ds.iloc[-1]
                if last["mem_used_mb"] == last["mem_used_mb"]:
                    mem.add_metric(labels, float(last["mem_used_mb"]) * MB)
                if last["power_w"] == last["power_w"]:
                    power.add_metric(labels, float(last["power_w"]))
        yield from (util, mem, power)


class ExporterError(RuntimeError):
    """The endpoint cannot be served; the message says why and what to do."""


def serve(db: str, ctx: Context, port: int, address: str = "127.0.0.1") -> Exporter:
    """Serve /metrics on address:port in daemon threads, each scrape answered from a
    snapshot (NOTE [scrape from a snapshot]); shutdown() and server_close() end it."""
    collector = StoreCollector(db, ctx, assess_every=ASSESS_S)
    snapshots = Snapshots(collector.families, collector.counters)
    try:
        server = start(port, address, snapshots.answer)
    except OSError as exc:
        raise ExporterError(f"cannot serve metrics on {address}:{port} ({exc.strerror or exc})"
                            ": pick a free port with --metrics-port") from None
    # (each scrape builds its snapshot: NOTE [scrape from a snapshot] says why the loop is
    # not started)
    return Exporter(server, snapshots, collector)


class MetricsOutput:
    """/metrics served while a run lasts, as an output of its follow (monitor/assess/
    follow.py, monitor/manage/outputs.py): made (the port bound, ExporterError when it
    cannot be) before the run exists, shut down at close. Its snapshot is built from the
    store (StoreCollector), so the rows it is handed are not kept."""

    name, takes_rows = "prometheus", False  # its snapshot reads the store

    def __init__(self, db: str, ctx: Context, port: int, address: str = "127.0.0.1") -> None:
        self.server = serve(db, ctx, port, address)

    def start(self, run_id: int) -> None:
        """(Every run of the store is served, this one among them.)"""

    def on_rows(self, steps: Any, samples: Any) -> None:
        """(Its snapshot reads the store.)"""

    def on_verdict(self, a: Any) -> None:
        """(Its snapshot assesses each rank's window itself.)"""

    def verdict_every(self) -> float:
        return math.inf

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
