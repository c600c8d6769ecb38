"""`/metrics` for Prometheus: a prometheus-client custom collector over the store (no
text written as the client writes it, monitor/export/exposition.py). NOTE [what a scrape
reads] below.

Names follow Prometheus conventions: one prefix (`starvation_`), base units (`_seconds`,
`_bytes`, ratios 0-1, `_total` for counters). Run series are per rank, labelled RUN_LABELS
(`run_id`, `job_id`, `rank`, `local_rank`, `node_rank`, `hostname`, the rank's `gpu` and
`UUID`, and the scheduler's `hpc_job`, `pod`, `namespace`, `replica` where set); GPU
series carry `gpu`, `UUID` and `hostname`, spelled as dcgm-exporter spells them, so
`on(hostname, gpu)` joins ours with `DCGM_FI_DEV_GPU_UTIL`. No step numbers or PIDs as
labels; an ended run ages out after RECENT_S. The data-wait share over any window is
`rate(starvation_data_wait_seconds_total[w]) / rate(starvation_step_seconds_total[w])`.

Each read is on the reading thread's own SQLite connection (WAL: readers never block the
workload's writes), closed before it returns. See METRICS for the list.
"""

# NOTE [what a scrape reads]
# Served (`serve`), a scrape reads the store as it is: every family but the counters, then
# the counters (each rank's sums kept between scrapes, the steps past the last one's mark
# added), each rank's recent window assessed (its verdict, cause, wait and busy gauges) at
# most every ASSESS_S and reused between: an assessment takes 10-35 ms a rank, so assessing
# at every scrape took 131 ms of CPU a scrape at 8 ranks (bench/scrape_cost.py). The rest
# is read as tuples, never DataFrames (the runs, ranks and host rows: 12 ms of pandas a
# scrape at 8 ranks before), and written by monitor/export/exposition.py (each rank's label
# set escaped once: the client's encoder took 7 ms for the same bytes). A scrape with the
# assessments reused costs 3-4 ms of CPU at 8 ranks (docs/benchmarks.md, 2026-12-06).
# A loop that built the snapshot just before each scrape was due (so that a scrape only read
# the counters) was tried and removed: with it, tests/test_cluster.py's two-node job read a
# PromQL throughput 9-17% under the stores' in 5 runs of 6, and each scrape reading its own
# did not (0 of 3), for a reason never found; at 3-4 ms a scrape it saves little.
# A collector that is not served (a test's registry, a one-off text) assesses every time.

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
from prometheus_client.samples import Sample

from monitor.assess.devices import workload_gpu
from monitor.assess.recent import read_recent, steady_verdict
from monitor.assess.window import Assessment, Context, Window, assess
from monitor.config import LIVE_SETTINGS, LOADER_SETTINGS
from monitor.diagnosis import VERDICTS
from monitor.diagnosis.causes import CAUSES
from monitor.export.metrics_http import Exporter, Scrapes, start
from monitor.records import PLACEMENT
from monitor.store import ATTACHED, RUNNING, Store
from monitor.thresholds import KPI_WINDOW_S

PREFIX = "starvation_"
RECENT_S = 300.0  # ended runs stay exported this long, so their last increments are scraped
ASSESS_S = 5.0  # a served rank's window is assessed this often (NOTE [what a scrape reads])
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
HOST_COLUMNS = [*(col for _, col, _ in HOST_GAUGES), "workers_rss_mb"]  # read for them


def _fam(kind: type, name: str, labels: list[str], **kw: Any) -> Any:
    """A family; counters and infos are named without the suffix the client adds."""
    doc = DOC.get(name) or DOC.get(f"{name}_total") or DOC[f"{name}_info"]
    return kind(PREFIX + name, doc, labels=labels, **kw)


VERDICT_STATES = tuple(sorted(VERDICTS))
CAUSE_STATES = tuple(sorted((*CAUSES, NO_CAUSE)))


def _states(fam: Any, labels: list[str], states: tuple[str, ...], current: str) -> None:
    """A state set's samples for one rank, as StateSetMetricFamily.add_metric makes them
    (the states sorted, 1 for `current`), the rank's labels zipped once, not once a state
    (a ~20-state cause set for each of 8 ranks at every scrape)."""
    base = dict(zip(fam._labelnames, labels, strict=True))
    name = fam.name
    fam.samples.extend(Sample(name, {**base, name: st}, 1 if st == current else 0)
                       for st in states)


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
    """The registry's collector: every series from the store, read at each collect (served:
    at each scrape, `serve`)."""

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
        self.assess_every = assess_every  # 0: each collect assesses each rank
        self.reader: Store | None = None  # opened once; each read opens a connection only
        # (run, rank) -> (when, its settings, the assessment, made after the run ended)
        self.assessed: dict[tuple[int, int], tuple[float, Any, Assessment, bool]] = {}

    def _reader(self) -> Store:
        """The store, opened once (its schema checked once): each thread's read opens its
        own connection, closed by the reader (scrapes come on new threads)."""
        if self.reader is None:
            self.reader = Store(self.db)
        return self.reader

    def describe(self) -> list[Metric]:
        return []  # families vary with the store; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from self.read()

    def read(self) -> list[Metric]:
        """Every family from the store now, on one connection of this thread, closed before
        it returns (scrapes come on new threads): the counters are read last, their sums
        at the scrape, whose time Prometheus stamps them with (rate() needs that)."""
        store = self._reader()
        try:
            counted, families = self._runs(store)
            return [*self._counters(store, counted), *families, *self._gpus(store)]
        finally:
            store.close()  # (this thread's connection)

    def _counters(self, store: Store, counted: Counted) -> list[Metric]:
        """The counter families of the ranks `counted`."""
        fams = {n: _fam(CounterMetricFamily, n, RUN_LABELS) for n in COUNTERS}
        totals = self._totals(store, counted.runs) if counted.runs else {}
        for key, labels, started_at in counted.ranks:
            t = totals.get(key, {})
            # counted from the rank's first step: a young rank's rate reads its own age
            # (monitor/export/promql.py throughput)
            created = float(t.get("first_ts") or started_at)
            for name, fam in fams.items():
                fam.add_metric(labels, float(t.get(name, 0.0)), created=created)
        return list(fams.values())

    def ranks_of(self, store: Store, run: dict, devices: list,
                 stepped: bool = True) -> list[RankSeries]:
        """The run's ranks as they reported themselves; a run with none is rank 0 of one,
        except a script whose probe has not said who it is and has no steps: no series yet."""
        rid = str(run["id"])
        rows = store.rank_records(int(run["id"]))
        if not rows and run.get("kind") == ATTACHED and not stepped:
            return []
        if not rows:
            gpu = workload_gpu(devices, run.get("device"))
            return [RankSeries(0, [rid, "", "0", "", "", self.hostname, _text(gpu),
                                   self._uuid(devices, gpu), *([""] * len(PLACEMENT))],
                               run.get("config") or {}, 1)]
        out = []
        for r in rows:
            gpu = workload_gpu(devices, r["device"]) if r["device"] else None
            out.append(RankSeries(int(r["rank"]), [
                rid, _text(r.get("job_id")), str(int(r["rank"])), _text(r["local_rank"]),
                _text(r.get("node_rank")), _text(r["hostname"]) or self.hostname,
                _text(gpu), self._uuid(devices, gpu),
                *(str((r.get("placement") or {}).get(k, "")) for k in PLACEMENT)],
                r["config"] or run.get("config") or {}, int(r["world_size"] or 1)))
        return out

    @staticmethod
    def _uuid(devices: list, gpu: int | None) -> str:
        return next((d.uuid or "" for d in devices if gpu is not None and d.index == gpu), "")

    def _runs(self, store: Store) -> tuple[Counted, list[Metric]]:
        now = time.time()
        runs = store.shown_runs(now - RECENT_S)
        counted = Counted([int(r["id"]) for r in runs], [])
        gauges = {n: _fam(GaugeMetricFamily, n, RUN_LABELS) for n in (
            "wait_per_step_seconds", "device_busy_ratio", *(g for g, _, _ in HOST_GAUGES))}
        verdict = _fam(StateSetMetricFamily, "verdict", RUN_LABELS)
        cause = _fam(StateSetMetricFamily, "cause", RUN_LABELS)
        loader = _fam(InfoMetricFamily, "loader", RUN_LABELS)
        info = _fam(InfoMetricFamily, "run", RUN_LABELS)
        totals = self._totals(store, counted.runs)
        devices = store.gpu_inventory()[2]
        for run in runs:
            rid = int(run["id"])
            ranks = self.ranks_of(store, run, devices, any(k[0] == rid for k in totals))
            if not ranks:
                continue
            ended = run.get("status") != RUNNING
            end = min(now, run["ended_at"]) if ended else now
            # every rank assessed within assess_every (an ended run's once, its window fixed):
            # its window is not read
            fresh = all(self._assessed((rid, rs.rank), rs.config, now, ended) for rs in ranks)
            recent = read_recent(store, rid, end) if not fresh else None
            last = store.host_last(rid, end - KPI_WINDOW_S, end, HOST_COLUMNS)
            for rs in ranks:
                counted.ranks.append(((rid, rs.rank), rs.labels, float(run["started_at"])))
                if recent is not None or fresh:
                    self._recent(recent.window(rs.rank) if recent is not None else None,
                                 (rid, rs.rank), rs.config, now, rs.labels, gauges,
                                 (verdict, cause), last.get(rs.rank, last.get(None)), ended)
                cfg = rs.config
                loader.add_metric(rs.labels, {k: str(cfg.get(k)) for k in LOADER_SETTINGS})
                info.add_metric(rs.labels, {
                    "name": str(run["name"]), "kind": str(run["kind"]),
                    "status": str(run["status"]),
                    "accelerator_kind": str(run.get("accelerator_kind")),
                    "world_size": str(rs.world_size)})
        with self.lock:  # the runs no longer shown: their verdicts are let go
            shown = set(counted.runs)
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

    def _assessed(self, key: tuple[int, int], config: dict, now: float,
                  ended: bool = False) -> Assessment | None:
        """The rank's assessment if it is younger than `assess_every`, or was made after its
        run ended and the run has not started again (its window cannot change), its
        settings the same."""
        seq = (key, tuple(str(config.get(k)) for k in LIVE_SETTINGS))
        with self.lock:
            got = self.assessed.get(key)
        return got[2] if got is not None and got[1] == seq and \
            ((got[3] and ended) or now - got[0] < self.assess_every) else None

    def _recent(self, w: Window | None, key: tuple[int, int], config: dict, now: float,
                labels: list[str], gauges: dict, verdicts: tuple[Any, Any],
                host: dict[str, Any] | None = None, ended: bool = False) -> None:
        """One rank's gauges and verdict over its last 10 s (the page's KPI window); the
        verdict held as the page's banner holds it (assess/recent.py steady_verdict). An
        assessment younger than `assess_every` with the same settings is used again (then
        `w` may be None); `host`: the rank's newest host row of the window (Store.host_last);
        `ended`: the run has ended, so this assessment is its last."""
        seq = (key, tuple(str(config.get(k)) for k in LIVE_SETTINGS))
        a = self._assessed(key, config, now, ended)
        if a is None:
            if w is None:
                return
            a = assess(w, self.ctx)
            with self.lock:
                self.assessed[key] = (now, seq, a, ended)
        f = a.features
        if f.steps:
            gauges["device_busy_ratio"].add_metric(labels, f.device_busy_mean)
            gauges["wait_per_step_seconds"].add_metric(labels, f.wait_per_step_s)
        with self.lock:
            shown, _ = steady_verdict(self.held, key, a, seq, now)
        verdict, cause = verdicts
        _states(verdict, labels, VERDICT_STATES, shown.verdict)
        named = shown.diagnosis.cause or NO_CAUSE
        _states(cause, labels, CAUSE_STATES, named)
        if host is not None:  # the rank's newest host row (USS carried forward, else RSS)
            for name, col, scale in HOST_GAUGES:
                v = host.get(col)
                if col == "workers_uss_mb" and (v is None or v != v):
                    v = host.get("workers_rss_mb")
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
    """Serve /metrics on address:port in daemon threads, each scrape reading the store
    (NOTE [what a scrape reads]); shutdown() and server_close() end it."""
    collector = StoreCollector(db, ctx, assess_every=ASSESS_S)
    scrapes = Scrapes(collector.read)
    try:
        server = start(port, address, scrapes.answer)
    except OSError as exc:
        raise ExporterError(f"cannot serve metrics on {address}:{port} ({exc.strerror or exc})"
                            ": pick a free port with --metrics-port") from None
    return Exporter(server, scrapes, collector)


class MetricsOutput:
    """/metrics served while a run lasts, as an output of its follow (monitor/assess/
    follow.py, monitor/manage/outputs.py): made (the port bound, ExporterError when it
    cannot be) before the run exists, shut down at close. A scrape reads the store
    (StoreCollector), so the rows it is handed are not kept."""

    name, takes_rows = "prometheus", False  # a scrape reads the store

    def __init__(self, db: str, ctx: Context, port: int, address: str = "127.0.0.1") -> None:
        self.server = serve(db, ctx, port, address)

    def start(self, run_id: int) -> None:
        """(Every run of the store is served, this one among them.)"""

    def on_rows(self, steps: Any, samples: Any) -> None:
        """(A scrape reads the store.)"""

    def on_verdict(self, a: Any) -> None:
        """(A scrape assesses each rank's window itself.)"""

    def verdict_every(self) -> float:
        return math.inf

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
