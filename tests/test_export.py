"""Export: /metrics scraped by a real Prometheus (Debian's), the Grafana dashboard checked
against what the exporter exposes, and run files that round-trip exactly."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from monitor.export.files import export_run, export_zip, import_run, run_frames, steps_checksum
from monitor.export.prometheus import HOST_GAUGES, StoreCollector
from monitor.records import GpuDevice, GpuUtilSample
from monitor.store import Store
from tests.conftest import require, wait_for
from tests.helpers import cli, free_port
from tests.test_assess import context, stored_run

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "deploy" / "grafana" / "starvation-monitor.json"



def scrape_text(db: Path) -> str:
    reg = CollectorRegistry()
    reg.register(StoreCollector(str(db), context(), hostname="node-a"))
    return generate_latest(reg).decode()


def exposed_names(text: str) -> set[str]:
    """Every series name in a scrape, and every family declared (# TYPE), with the suffix a
    counter's or info's samples carry."""
    names = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M)}
    for name, kind in re.findall(r"^# TYPE (\S+) (\w+)", text, re.M):
        names.add(name + {"counter": "_total", "info": "_info"}.get(kind, ""))
    return names


def test_metrics_names_labels_and_dcgm_join(store, db_path):
    run = stored_run(store, status="running", t0=time.time() - 21.0)
    store.update_run(run, pid=os.getpid())
    store.set_gpu_inventory(True, "NVML", [GpuDevice(0, "H200", "GPU-abc", (0, 1, 0), 1.0)])
    text = scrape_text(db_path)
    names = exposed_names(text)
    for n in ("starvation_steps_total", "starvation_samples_total",
              "starvation_data_wait_seconds_total", "starvation_compute_seconds_total",
              "starvation_step_seconds_total", "starvation_verdict", "starvation_loader_info",
              "starvation_run_info", "starvation_workers_cpu_cores",
              "starvation_main_process_memory_bytes"):
        assert n in names, n
    assert (f'starvation_steps_total{{UUID="",gpu="",hostname="node-a",hpc_job="",job_id="",'
            f'local_rank="",namespace="",node_rank="",pod="",rank="0",replica="",'
            f'run_id="{run}"}} 200.0') in text
    assert re.search(r'starvation_loader_info\{.*num_workers="0".*\} 1\.0', text)
    # the GPU series are labelled as dcgm-exporter labels them: joinable on(hostname, gpu)
    store.insert([GpuUtilSample(ts=time.time(), gpu=0, util_pct=87.0, source="samples")])
    text = scrape_text(db_path)
    assert 'starvation_gpu_utilization_ratio{UUID="GPU-abc",gpu="0",hostname="node-a"} 0.87' \
        in text
    # no high-cardinality labels: no step numbers, no PIDs
    assert not re.search(r'\b(step|pid)="', text)


def test_the_exporters_verdict_is_held_as_the_pages_banner_holds_it(store, db_path):
    """One moment, one verdict: a rank that starved and now waits for nothing stays
    `starving` to the exporter until `healthy` has held a whole KPI window (the banner's
    hysteresis, monitor/assess/recent.py), not from the first scrape that sees it; a
    settings change shows at once."""
    from prometheus_client.core import GaugeMetricFamily, StateSetMetricFamily

    from monitor.assess.recent import HOLD_S, read_recent
    from monitor.records import StepRecord

    now = time.time()
    starved = stored_run(store, status="running", t0=now - 21.0)
    fed = stored_run(store, status="running", t0=now - 45.0)  # its starved steps end at -24 s
    store.insert([StepRecord(fed, 1000 + i, 5, now - 12.0 + i * 0.041, 0.001, 0.04, 32, 0)
                  for i in range(290)])  # its last 12 s: fed, 1 ms of wait a step
    windows = {r: read_recent(store, r, now).window(0) for r in (starved, fed)}
    c = StoreCollector(str(db_path), context(), hostname="node-a")

    def shown(run: int, at: float, config: dict | None = None) -> str:
        fam = StateSetMetricFamily("v", "", labels=["rank"])
        gauges = {n: GaugeMetricFamily(n, "", labels=["rank"]) for n in (
            "device_busy_ratio", "wait_per_step_seconds", *(g for g, _, _ in HOST_GAUGES))}
        cause = StateSetMetricFamily("c", "", labels=["rank"])
        c._recent(windows[run], (starved, 0), config or {"num_workers": 0}, at, ["0"],
                  gauges, (fam, cause))
        # the cause's stateset has one state set: none here (no finding holds)
        assert [s.labels["c"] for s in cause.samples if s.value == 1.0] == ["none"]
        return next(s.labels["v"] for s in fam.samples if s.value == 1.0)

    assert shown(starved, 0.0) == "starving" and shown(fed, 1.0) == "starving"
    assert shown(fed, HOLD_S - 0.5) == "starving"
    assert shown(fed, 1.0 + HOLD_S) == "healthy"
    assert shown(starved, 2.0 + HOLD_S, {"num_workers": 2}) == "starving"  # a change: at once


def test_counters_read_only_the_steps_since_the_last_scrape_and_match_a_full_read(store,
                                                                                  db_path):
    """A scrape adds the rows past each run's mark to the sums it kept (a scrape that summed
    every step of a 20 min, 8-rank run took 774 ms, and grew with the run); two runs, steps
    added to both between scrapes, read as a fresh collector's full sums."""
    from monitor.records import StepRecord

    now = time.time()
    a, b = (stored_run(store, status="running", t0=now - 30.0) for _ in range(2))
    c = StoreCollector(str(db_path), context(), hostname="node-a")
    first = c._totals(store, [a, b])
    assert first[(a, 0)]["steps"] == 200 and set(c.marks) == {a, b}
    marks = dict(c.marks)
    store.insert([StepRecord(r, 200 + i, 2, now - 5.0 + i * 0.1, 0.01, 0.04, 16, 0, rank=r0)
                  for r in (a, b) for r0 in (0, 1) for i in range(10)])
    kept = c._totals(store, [a, b])
    assert all(c.marks[r] > marks[r] for r in (a, b))
    full = StoreCollector(str(db_path), context(), hostname="node-a")._totals(store, [a, b])
    assert kept.keys() == full.keys() == {(a, 0), (a, 1), (b, 0), (b, 1)}
    for key in full:
        for k in ("steps", "samples", "data_wait_seconds", "step_seconds", "first_ts"):
            assert kept[key][k] == pytest.approx(full[key][k]), (key, k)
    assert kept[(a, 0)]["steps"] == 210 and kept[(a, 1)]["samples"] == 160
    assert c._totals(store, [b]).keys() == {(b, 0), (b, 1)}  # a run no longer shown: let go
    assert set(c.marks) == {b}


def promql_metrics(expr: str) -> set[str]:
    """Metric names an expression reads: label matchers, grouping clauses, ranges, strings
    and functions removed, what is left that looks like a name."""
    e = re.sub(r'"[^"]*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\w+", "", e)
    words = re.findall(r"(?<![\w:])[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", e)
    keywords = {"and", "or", "unless", "offset", "bool", "by", "on", "Inf", "NaN"}  # literals too
    return {w for w in words if w not in keywords and not re.fullmatch(r"[0-9.e]+", w)}


def test_a_served_scrape_reads_the_store_as_it_is_at_the_scrape(store, db_path):
    """Served, /metrics reads the store at each scrape (NOTE [what a scrape reads]): steps
    added between two scrapes count in the second at once, in every format a scraper asks for
    (OpenMetrics gzipped, as Prometheus asks; the text format), and the two formats parse
    to the same series as a fresh collector's."""
    import gzip

    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
    from prometheus_client.parser import text_string_to_metric_families as text

    from monitor.export.prometheus import serve
    from monitor.records import StepRecord

    run = stored_run(store, status="running", t0=time.time() - 21.0)
    store.update_run(run, pid=os.getpid())
    port = free_port()
    exporter = serve(str(db_path), context(), port)
    prom = ("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,"
            "*/*;q=0.2")

    def scrape(accept: str) -> str:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Accept": accept, "Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return (gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip"
                    else body).decode()

    def samples(families) -> dict[tuple, float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in families for s in f.samples if not s.name.endswith("_created")}

    def steps_counted(t: str) -> float:
        return next(v for (n, _), v in samples(om(t) if t.endswith("# EOF\n") else text(t))
                    .items() if n == "starvation_steps_total")

    try:
        first = scrape(prom)
        assert first.endswith("# EOF\n") and first.count("# EOF") == 1
        assert steps_counted(first) == 200
        for k in range(3):  # more steps between scrapes: each scrape counts them
            store.insert([StepRecord(run, 200 + 10 * k + i, 2, time.time(), 0.01, 0.04, 32, 0)
                          for i in range(10)])
            assert steps_counted(scrape(prom)) == 210 + 10 * k
        assert steps_counted(scrape("text/plain")) == 230
        served = samples(om(scrape(prom)))
        fresh = samples(om(generate_latest_om(db_path)))
        assert served.keys() == fresh.keys()
        assert any(n == "starvation_verdict" for n, _ in served)
    finally:
        exporter.shutdown()
        exporter.server_close()
    assert wait_for(lambda: not any(t.name == "starvation-metrics-http"
                                    for t in threading.enumerate()), timeout=10)


def test_a_scrape_of_a_store_that_cannot_be_read_is_a_sentence_not_a_traceback(tmp_path,
                                                                                capfd):
    """The store is not one (a file of something else): the scrape answers 503 with a
    sentence, nothing is printed, and the exporter keeps serving."""
    from monitor.export.prometheus import serve

    db = tmp_path / "not-a-store.db"
    db.write_bytes(b"this is not SQLite" * 100)
    port = free_port()
    exporter = serve(str(db), context(), port)
    try:
        for _ in range(2):
            with pytest.raises(urllib.error.HTTPError) as got:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30)
            assert got.value.code == 503
            said = got.value.read().decode()
            assert said.startswith("starvation-monitor: the store cannot be read now"), said
    finally:
        exporter.shutdown()
        exporter.server_close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err


def generate_latest_om(db: Path) -> str:
    """A fresh collector's scrape in OpenMetrics."""
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    reg = CollectorRegistry()
    reg.register(StoreCollector(str(db), context(), hostname=socket.gethostname()))
    return om_latest(reg).decode()


def test_grafana_dashboard_reads_only_what_is_exported(store, db_path):
    doc = json.loads(GRAFANA.read_text())
    assert doc["schemaVersion"] >= 30 and doc["title"] and doc["panels"]
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert all(p["targets"] for p in doc["panels"])
    exprs += [a["expr"] for a in doc["annotations"]["list"]]
    exprs += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    stored_run(store, status="running")
    exposed = exposed_names(scrape_text(db_path))
    used = set().union(*(promql_metrics(re.sub(r"label_values\((.*),\s*\w+\)", r"\1", e))
                         for e in exprs))
    ours = {m for m in used if m.startswith("starvation_")}
    assert ours and ours <= exposed, ours - exposed
    assert used - ours <= {"DCGM_FI_DEV_GPU_UTIL"}, used - ours
    assert any("rate(starvation_data_wait_seconds_total" in e for e in exprs)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_import_round_trips_exactly(store, tmp_path, fmt):
    run = stored_run(store)
    store.add_event(run, "config", "num_workers 0→2", {"num_workers": 2})
    store.request_control(run, "config", {"num_workers": 2})
    folder = export_run(store, run, tmp_path / "out", fmt, context())
    doc = json.loads((folder / "run.json").read_text())
    assert doc["summary"]["verdict"] == "starving" and doc["rows"]["steps"] == 200
    other = Store(tmp_path / "colleague.db")
    new = import_run(other, folder)
    a, b = run_frames(store, run), run_frames(other, new)
    assert {t: len(df) for t, df in a.items()} == {t: len(df) for t, df in b.items()}
    assert steps_checksum(b["steps"]) == doc["steps_sha256"] == steps_checksum(a["steps"])
    again = json.loads((export_run(other, new, tmp_path / "again", fmt, context())
                        / "run.json").read_text())
    assert again["summary"] == doc["summary"] and again["run"]["config"] == doc["run"]["config"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_an_exported_two_rank_job_imports_with_both_ranks(store, tmp_path, fmt):
    run = stored_run(store)
    for r in (0, 1):
        store.set_rank(run, r, r, 2, "node-a", 1000 + r, {"num_workers": 2 + r}, "cpu",
                       job_id="job-7", node_rank=0, nodes=1,
                       placement={"pod": f"train-{r}", "namespace": "ml"} if r else None)
    folder = export_run(store, run, tmp_path / "out", fmt, context())
    other = Store(tmp_path / "colleague.db")
    got = other.ranks(import_run(other, folder))
    assert got["rank"].tolist() == [0, 1] and got["world_size"].tolist() == [2, 2]
    assert [c["num_workers"] for c in got["config"]] == [2, 3]
    assert set(got["job_id"]) == {"job-7"}
    assert got["placement"].tolist() == [{}, {"pod": "train-1", "namespace": "ml"}]
    # an export of an older version, before ranks were exported, still imports
    (folder / f"ranks.{fmt}").unlink()
    assert other.ranks(import_run(other, folder)).empty


def test_download_zip_holds_the_export_files(store, db_path, tmp_path):
    run = stored_run(store)
    folder = export_run(store, run, tmp_path, "csv", context())
    with zipfile.ZipFile(io.BytesIO(export_zip(str(db_path), run, "csv", context()))) as z:
        names = sorted(n.split("/", 1)[1] for n in z.namelist())
        assert names == sorted(p.name for p in folder.iterdir())
        for n in names:
            if n != "run.json":  # run.json is the same but for the assessment's CPU budget
                assert z.read(f"{folder.name}/{n}") == (folder / n).read_bytes(), n



def test_export_bad_input_is_one_line_and_writes_nothing(store, db_path, tmp_path):
    run = stored_run(store)
    r = cli("export", "99", "--db", str(db_path), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no run '99'" in r.stderr
    assert not (tmp_path / "o").exists()
    r = cli("export", str(run), "--db", str(db_path), "--out", "/proc/not-here")
    assert r.returncode == 2 and "pass --out" in r.stderr
    r = cli("import", str(tmp_path), "--db", str(tmp_path / "x.db"))
    assert r.returncode == 2 and "not a run export" in r.stderr
    assert not (tmp_path / "x.db").exists()


def test_import_takes_the_export_root_with_one_run(store, db_path, tmp_path):
    """`export --out OUT` writes OUT/run-<id>-<format>/: `import OUT` takes that one run, and
    with several, names them and imports none."""
    run = stored_run(store)
    out = tmp_path / "out"
    assert cli("export", str(run), "--db", str(db_path), "--out", str(out)).returncode == 0
    r = cli("import", str(out), "--db", str(tmp_path / "a.db"))
    assert r.returncode == 0 and r.stdout.startswith("imported as run 1"), r.stderr
    assert len(Store(tmp_path / "a.db").steps(1)) == len(store.steps(run))
    assert cli("export", str(run), "--db", str(db_path), "--out", str(out),
               "--format", "parquet").returncode == 0
    r = cli("import", str(out), "--db", str(tmp_path / "b.db"))
    assert r.returncode == 2 and "holds 2 run exports" in r.stderr, r.stderr
    assert f"run-{run}-csv" in r.stderr and f"run-{run}-parquet" in r.stderr
    assert not (tmp_path / "b.db").exists()


def test_busy_metrics_port_is_refused_before_anything_runs(tmp_path, no_leaks):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("run", "--db", str(tmp_path / "r.db"), "--metrics-port", str(port), "--",
                sys.executable, "-c", "print('never')")
    assert r.returncode == 2 and "pick a free port" in r.stderr and "never" not in r.stdout
    assert Store(tmp_path / "r.db").runs().empty


def prom_query(base: str, query: str, **params: str) -> list:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query, **params})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def start_prometheus(prom: str, tmp_path: Path, port: int,
                     config: str) -> tuple[subprocess.Popen, str]:
    """Debian's Prometheus on 127.0.0.1:port with this config: (process, its base URL)."""
    (tmp_path / "prometheus.yml").write_text(config)
    p = subprocess.Popen([prom, f"--config.file={tmp_path / 'prometheus.yml'}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_real_prometheus_rate_matches_the_store(store, no_leaks, runtime, tmp_path):
    """A real Prometheus scrapes /metrics of a running workload; PromQL's data-wait share
    over a window equals the store's figure for the same window within 5%."""
    prom = require(shutil.which("prometheus"), "prometheus")
    from monitor.config import LoaderConfig

    port, pport = free_port(), free_port()
    runtime.serve_metrics(port)
    run = runtime.manager.start(LoaderConfig.build(preset="starving", batch_size=8,
                                                   step_time_ms=20.0))
    p, base = start_prometheus(
        prom, tmp_path, pport, "global: {scrape_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: starvation\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    sel = f'{{run_id="{run}"}}'
    try:
        def enough() -> list | None:
            try:
                rs = [prom_query(base, f"starvation_{c}_seconds_total{sel}[15s]")
                      for c in ("step", "data_wait")]
            except OSError:
                return None
            # 12 scrapes, the workload stepping over the last 10 (a saturated box once had
            # its first steps after them: a window of no steps is no ratio), and each counter
            # at the window's start already a third of its rise over it: rate() extrapolates
            # to the window's edges but not below a counter's zero, and a run that began
            # stepping at the window's start had one counter's rate clamped so and not the
            # other's (0.78865 against 0.78930)
            vs = [[float(x[1]) for x in r[0]["values"]] if r else [] for r in rs]
            return rs[0] if all(len(v) >= 12 and v[-1] > v[-10] and v[-10] >= (v[-1] - v[-10]) / 3
                                for v in vs) else None
        assert wait_for(enough, timeout=120, every=0.5), "Prometheus never scraped 12 times"
        # the three at one instant: a scrape landing between them moves the window, and
        # with it both counters' increases (0.83905 against 0.84102 seen so)
        at = {"time": f"{time.time():.3f}"}
        wait_r = prom_query(base, f"starvation_data_wait_seconds_total{sel}[10s]", **at)
        step_r = prom_query(base, f"starvation_step_seconds_total{sel}[10s]", **at)
        ratio = prom_query(base, f"rate(starvation_data_wait_seconds_total{sel}[10s]) / "
                                 f"rate(starvation_step_seconds_total{sel}[10s])", **at)
    finally:
        p.terminate()
        p.wait(30)
    (w0, w1), (s0, s1) = [(r[0]["values"][0], r[0]["values"][-1]) for r in (wait_r, step_r)]
    promql = float(ratio[0]["value"][1])
    assert promql == pytest.approx((float(w1[1]) - float(w0[1])) /
                                   (float(s1[1]) - float(s0[1])), rel=1e-6)
    steps = store.steps(run, since=float(w0[0]) - 0.5, until=float(w1[0]))
    share = steps["wait_s"].sum() / (steps["wait_s"].sum() + steps["compute_s"].sum())
    print(f"PromQL data-wait share {promql:.4f}, store {share:.4f} over "
          f"{float(w1[0]) - float(w0[0]):.1f} s")
    assert promql == pytest.approx(share, rel=0.05)


def test_page_offers_the_selected_runs_files(store, no_leaks, quiet_page):
    run = stored_run(store)
    at = quiet_page
    at.run()
    assert not at.exception
    labels = sorted(b.proto.label for b in at.get("download_button"))
    assert labels == ["Download run (CSV, zip)", "Download run (Parquet, zip)"]
    assert at.selectbox(key="selected_run").value == run


def test_deploy_files_are_what_promql_writes():
    """The dashboard and the rules on disk are monitor/export/promql.py's (one home for every
    expression, thresholds from monitor/thresholds.py)."""
    from monitor.export import promql
    from monitor.thresholds import STRAGGLER_MIN_S, STRAGGLER_RATIO

    for rel, text in promql.files().items():
        assert (ROOT / "deploy" / rel).read_text() == text, (
            f"deploy/{rel} is stale: python -m monitor.export.promql --write deploy")
    rules = (ROOT / "deploy" / "prometheus" / "rules.yml").read_text()
    assert f">= {STRAGGLER_RATIO:g} *" in rules and f">= {STRAGGLER_MIN_S:g})" in rules
    promtool = shutil.which("promtool")
    if promtool:  # Debian's prometheus package ships it
        r = subprocess.run([promtool, "check", "rules", str(ROOT / "deploy" / "prometheus" /
                                                          "rules.yml")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_a_ranks_placement_labels_its_series(store):
    """A rank in a Kubernetes pod (the downward API's POD_NAME and POD_NAMESPACE, an
    indexed Job's JOB_COMPLETION_INDEX) or a Slurm job: its series carry pod, namespace,
    replica and hpc_job, for the joins with dcgm-exporter's series."""
    from monitor.probe.identity import placement

    run = stored_run(store)
    pod = placement({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-w-1",
                     "POD_NAMESPACE": "ml", "JOB_COMPLETION_INDEX": "1"})
    assert pod == {"pod": "train-w-1", "namespace": "ml", "replica": "1"}
    slurm = placement({"SLURM_JOB_ID": "4242", "HOSTNAME": "gpu-node-3"})
    assert slurm == {"hpc_job": "4242"}  # not in a pod: no pod label from the hostname
    assert placement({"HOSTNAME": "laptop"}) == {}
    store.set_rank(run, 0, 0, 2, "node-a", 1000, {}, "cpu", job_id="j", placement=pod)
    store.set_rank(run, 1, 1, 2, "node-a", 1001, {}, "cpu", job_id="j", placement=slurm)
    reg = CollectorRegistry()
    reg.register(StoreCollector(str(store.db.path), context(), hostname="node-a"))
    text = generate_latest(reg).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("starvation_steps_total{")]
    assert len(lines) == 2, lines
    r0 = next(ln for ln in lines if 'rank="0"' in ln)
    assert 'pod="train-w-1"' in r0 and 'namespace="ml"' in r0 and 'replica="1"' in r0
    r1 = next(ln for ln in lines if 'rank="1"' in ln)
    assert 'hpc_job="4242"' in r1 and 'pod=""' in r1


def test_a_scrape_is_rendered_byte_for_byte_as_the_clients_encoders_render_it(store):
    """monitor/export/exposition.py renders the families itself (each label set escaped
    once): the same bytes as prometheus-client's encoder for every format and escaping a
    scraper can ask for, with label values that need escaping (a run's name with a quote,
    a backslash, a newline and non-ASCII), and the client's own encoder for a family it
    does not render (a unit)."""
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import choose_encoder

    from monitor.export.exposition import Families, Renderer

    run = stored_run(store, status="running", t0=time.time() - 21.0)
    store.update_run(run, pid=os.getpid(), name='we"ird\\name\nü')
    store.set_rank(run, 0, 0, 2, "node-a", 1000, {"num_workers": 2}, "cpu", job_id="j")
    store.set_rank(run, 1, 1, 2, "node-b", 1001, {"num_workers": 2}, "cpu", job_id="j",
                   placement={"pod": 'p"1'})
    store.set_gpu_inventory(True, "NVML", [GpuDevice(0, "H200", "GPU-abc", (0, 1, 0), 1.0)])
    store.insert([GpuUtilSample(ts=time.time(), gpu=0, util_pct=87.0, source="samples")])
    families = list(StoreCollector(str(store.db.path), context(), hostname="node-a").collect())
    kinds = {m.type for m in families}
    assert {"counter", "gauge", "stateset", "info"} <= kinds, kinds
    renderer = Renderer()
    for accept in ("", "text/plain;version=0.0.4", "application/openmetrics-text",
                   "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;"
                   "version=0.0.4;q=0.3,*/*;q=0.2",
                   *(f"{t};version=1.0.0;escaping={e}"
                     for t in ("application/openmetrics-text", "text/plain")
                     for e in ("underscores", "dots", "values", "allow-utf-8"))):
        encoder, _ = choose_encoder(accept)
        for _ in range(2):  # the second from what the first kept
            assert renderer.render(families, encoder) == encoder(Families(families)), accept
    assert 'name="we\\"ird\\\\name\\nü"' in renderer.render(
        families, choose_encoder("")[0]).decode()
    unit = GaugeMetricFamily("starvation_x_seconds", "a gauge with a unit", unit="seconds")
    unit.add_metric([], 1.0)
    om = choose_encoder("application/openmetrics-text")[0]
    assert b"# UNIT starvation_x_seconds seconds" in renderer.render([unit], om)


def test_an_ended_runs_ranks_are_assessed_once_and_a_running_ones_again(store, monkeypatch):
    """An ended run's window cannot change: the exporter assesses it once while it stays
    exported (RECENT_S), where a running one's is assessed again each ASSESS_S."""
    from monitor.export import prometheus

    made: list[int] = []
    real = prometheus.assess
    monkeypatch.setattr(prometheus, "assess", lambda w, ctx: made.append(1) or real(w, ctx))
    ended = stored_run(store, status="running", t0=time.time() - 30.0)
    store.update_run(ended, pid=os.getpid())
    store.finish_run(ended, "finished")
    running = stored_run(store, status="running", t0=time.time() - 21.0)
    store.update_run(running, pid=os.getpid())
    collector = StoreCollector(str(store.db.path), context(), hostname="node-a")  # assess_every 0
    reg = CollectorRegistry()
    reg.register(collector)
    texts = [generate_latest(reg).decode() for _ in range(3)]
    assert len(made) == 1 + 3, made  # the ended run's rank once, the running one's each time
    assert all('starvation_verdict{' in t and f'run_id="{ended}"' in t for t in texts)
    store.db.conn().execute("UPDATE runs SET status = 'running', ended_at = NULL "
                            "WHERE id = ?", (ended,))  # (were it to run again: assessed)
    generate_latest(reg)
    assert len(made) == 4 + 2, made
