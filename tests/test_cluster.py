"""A job across nodes, watched in Prometheus: a real two-node torchrun job on one box (two
agents, `--nnodes 2 --node-rank 0/1`, gloo on the CPU), each node under its own
`monitor run --metrics-port` with its own store, one real Prometheus (Debian's) scraping
both, the project's rules loaded, and a recorded-shaped dcgm-exporter page beside them. Every
panel query of the Grafana dashboard runs against that Prometheus; the straggler panel names
the slow rank; the job's throughput in PromQL is the sum of the two stores."""
from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from monitor.export import promql
from monitor.records import GpuDevice
from monitor.store import Store
from tests import jobs
from tests.conftest import require, wait_for
from tests.helpers import free_port
from tests.test_export import prom_query, start_prometheus

ROOT = Path(__file__).resolve().parent.parent
DDP = ROOT / "examples" / "train_ddp.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
DCGM_TEXT = (ROOT / "tests" / "fixtures" / "dcgm_exporter_metrics.txt").read_bytes()
GPU0_UUID = "GPU-9b1f4c2e-7d3a-4e8b-a6f0-2c5d8e1b3a47"  # the fixture's GPU 0, 37% busy
WINDOW = "12s"
pytestmark = pytest.mark.slow


def node(db: Path, port: int, node_rank: int, master: int, epochs: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--metrics-port", str(port),
         "--json", "--no-live", "--", TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
         "--master-port", str(master), str(DDP), "--epochs", str(epochs),
         "--slow-rank", "1", "--slow-factor", "4"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def ended(n: subprocess.Popen, timeout: float = 240) -> tuple[str, str]:
    """The node's (stdout, stderr) once it ends. One still running at the deadline fails the
    test with what each of its processes was doing, and its whole tree is killed (no
    orphans left to the next test)."""
    try:
        return n.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import psutil

        tree = [n.pid] + [c.pid for c in psutil.Process(n.pid).children(recursive=True)]
        seen = []
        for pid in tree:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                seen.append(f"{pid} {proc.status()} {' '.join(proc.cmdline()[1:6])}")
        for pid in reversed(tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = n.communicate()
        pytest.fail(f"node still running after {timeout:.0f} s: {seen}; its stdout ends "
                    f"{(out or '')[-600:]!r}; its stderr {(err or '')[-1500:]!r}")


class _Dcgm(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(DCGM_TEXT)

    def log_message(self, *args: object) -> None:
        pass


def panel_queries() -> dict[int, list[str]]:
    """Each panel's expressions as Grafana sends them with every variable at All."""
    doc = json.loads((ROOT / "deploy" / "grafana" / "starvation-monitor.json").read_text())
    out = {}
    for p in doc["panels"]:
        out[p["id"]] = [re.sub(r'=~"\$\w+"', '=~".*"', t["expr"]).replace(
            "$__rate_interval", WINDOW) for t in p["targets"]]
    return out


def test_two_node_job_in_prometheus(tmp_path, no_leaks):
    prom = require(shutil.which("prometheus"), "prometheus")
    ports, pport, master = [free_port(), free_port()], free_port(), free_port()
    dcgm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dcgm)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    rules = tmp_path / "rules.yml"
    rules.write_text(promql.rules())
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
    p, base = start_prometheus(
        prom, tmp_path, pport, "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{rules}']\nscrape_configs:\n"
        f"  - job_name: starvation-monitor\n    static_configs: [{{targets: [{targets}]}}]\n"
        "  - job_name: dcgm-exporter\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{dcgm.server_address[1]}']}}]\n")
    dbs = [tmp_path / "node0.db", tmp_path / "node1.db"]
    nodes = [node(dbs[i], ports[i], i, master, epochs=11) for i in (0, 1)]
    results: dict[int, list[list]] = {}
    try:
        # node 0's rank runs on a GPU where NVML would say so (no GPU here: the inventory and
        # the rank's CUDA device are written as the collector and the probe would write them)
        def reported() -> bool:
            return dbs[0].exists() and not Store(dbs[0]).ranks(1).empty
        assert wait_for(reported, timeout=90), "node 0's rank never reported"
        s0 = Store(dbs[0])
        s0.set_gpu_inventory(True, "NVML (test)", [GpuDevice(0, "NVIDIA H200", GPU0_UUID,
                                                             (0, 0x19, 0), 143771.0)])
        s0.db.conn().execute("UPDATE ranks SET device = ? WHERE rank = 0",
                             (json.dumps({"uuid": GPU0_UUID, "cuda_index": 0}),))

        # a figure (issue 35: the straggler named within 5 s of both nodes' first steps):
        # how soon the Job tab's read names it, from the later node's first stored step
        from monitor.export import promread

        def named() -> bool:
            try:
                v = promread.job(base, f"127.0.0.1:{master}", rng=WINDOW)
            except promread.PrometheusError:
                return False
            return v.stragglers()["rank"].tolist() == [1]
        def first_steps() -> list[float] | None:
            ts = [fs["ts"].iloc[0] for d in dbs
                  if d.exists() and not (fs := Store(d).first_steps(1, 1)).empty]
            return ts if len(ts) == 2 else None
        firsts = wait_for(first_steps, timeout=90, every=0.2)
        if firsts and wait_for(named, timeout=30, every=0.5):  # (a figure, not a gate)
            print(f"the straggler named by the Job tab's read {time.time() - max(firsts):.1f} s "
                  "after both nodes' first steps")

        def scraped() -> bool:  # 13 s of both ranks, job-labelled, since the device was set:
            # 8 scrapes of 13 at least (a saturated box: a /metrics answer slower than the 1 s
            # scrape timeout is a scrape missed, and the 12 s window's rate has its two ends)
            try:
                full = prom_query(base, 'count_over_time(starvation_samples_total'
                                        '{job_id!=""}[13s]) >= 8')
            except OSError:
                return False
            return {(s["metric"]["rank"], s["metric"].get("gpu", "")) for s in full} >= \
                {("0", "0"), ("1", "")}

        def seen() -> str:
            try:
                got = prom_query(base, 'count_over_time(starvation_samples_total[13s])')
                up = prom_query(base, 'count_over_time(up{job="starvation-monitor"}[30s])'
                                      ' - sum_over_time(up{job="starvation-monitor"}[30s])')
            except OSError as exc:
                return str(exc)
            return (f"samples in 13 s {[(x['metric'], x['value'][1]) for x in got]}; failed "
                    f"scrapes in 30 s {[x['value'][1] for x in up]}; nodes running "
                    f"{[n.poll() is None for n in nodes]}")
        assert wait_for(scraped, timeout=120, every=0.5), \
            f"Prometheus never had 13 s of both: {seen()}"
        at = round(time.time() - 1.0, 3)  # (Prometheus keeps milliseconds)
        for pid, exprs in panel_queries().items():
            results[pid] = [prom_query(base, e, time=str(at)) for e in exprs]
        recorded = prom_query(base, "starvation:input_straggler", time=str(at))
        # the page's Job tab reads the same job back (dashboard --prometheus)
        tab = promread.job(base, f"127.0.0.1:{master}", rng=WINDOW, at=at)
        # the counters' raw samples in the window: what each scrape read, and when
        raw = prom_query(base, f'starvation_samples_total{{job_id!=""}}[{WINDOW}]',
                         time=str(at))
    finally:
        try:
            outs = [ended(n) for n in nodes]
        finally:
            for n in nodes:  # the other node, when one failed the test
                if n.poll() is None:
                    ended(n, timeout=30)
            p.terminate()
            p.wait(30)
            dcgm.shutdown()
    for n, (_out, err) in zip(nodes, outs, strict=True):
        assert n.returncode == 0, err[-3000:]
    empty = {pid: i for pid, rs in results.items() for i, r in enumerate(rs) if not r}
    assert not empty, f"panel queries with no data: {empty}"
    # one job across both nodes, both ranks with their node ranks
    per_rank = results[1][1]
    assert {(s["metric"]["rank"], s["metric"]["node_rank"]) for s in per_rank} == \
        {("0", "0"), ("1", "1")}
    assert {s["metric"]["job_id"] for s in per_rank} == {f"127.0.0.1:{master}"}
    assert [(s["metric"]["world_size"], s["value"][1]) for s in results[8][0]] == [("2", "2")]
    # the straggler panel, and the recording rule, name rank 1 on node 1
    for found in (results[4][0], recorded):
        assert [(s["metric"]["rank"], s["metric"]["node_rank"]) for s in found] == \
            [("1", "1")], found
    assert tab.ranks[["rank", "node_rank"]].values.tolist() == [[0, 0], [1, 1]]
    assert tab.stragglers()[["rank", "node_rank"]].values.tolist() == [[1, 1]]
    util = tab.ranks.set_index("rank")["gpu_util"]  # DCGM's, on the rank's GPU (the Job tab)
    assert util[0] == pytest.approx(0.37) and util[1] != util[1], util  # rank 1: no GPU
    # DCGM's utilization of node 0's GPU, labelled with the rank that uses it
    joined = results[6][0]
    assert [(s["metric"]["rank"], s["metric"]["gpu"], float(s["value"][1])) for s in joined] \
        == [("0", "0", 37.0)]
    # the job's throughput in PromQL is the two stores' over the same window. A counter
    # trails the store's step times: each scrape reads the rows stored by then (the relay's
    # lag, a step, the scrape's own time; a saturated suite: seconds), stamped with the
    # scrape's start. Measured here: each raw counter value is exactly the sum of the rank's
    # first stored steps (nothing counted twice or lost), and its trail the scrape's time
    # less the last of those steps' time; the window's rate moves by up to that trail
    span = float(WINDOW.rstrip("s"))
    # the part of the window each rank lived (from its first step's start)
    lived = [min(span, at - float((s["ts"] - s["wait_s"]).min()))
             for s in (Store(db).steps(1) for db in dbs)]
    trails, rates, bracketed = [], [], [0.0, 0.0]
    for series in raw:
        rank = int(series["metric"]["rank"])
        rows = Store(dbs[rank]).db.conn().execute(
            "SELECT ts, samples FROM steps WHERE run_id = 1 AND rank = ? ORDER BY rowid",
            (rank,)).fetchall()
        upto = dict(zip(itertools.accumulate([n for _, n in rows]), [t for t, _ in rows],
                        strict=True))
        for t, v in series["values"]:
            if float(v) == 0:  # (no step yet)
                continue
            assert float(v) in upto, (rank, v, "is no sum of the rank's first stored steps")
            trails.append(float(t) - upto[float(v)])
        rate, _seconds = prometheus_rate(series["values"], at, span)
        rates.append(rate)
        # the stretch of the rank's steps that two of its scrapes bracket: measured; the rest
        # of the part of the window it lived, rate() extrapolates at the bracketed rate, or
        # leaves out (a scrape missed at an edge)
        first, last = float(series["values"][0][1]), float(series["values"][-1][1])
        if last > 0:
            since = upto[first] if first > 0 else at - lived[rank]
            bracketed[rank] += upto[last] - max(since, at - span)
    job = float(results[1][0][0]["value"][1])
    # the panel is the rate of these counters, by Prometheus's own rule
    assert job == pytest.approx(sum(rates), rel=1e-6), (job, rates)
    # and it reads the stores' rate within the share of the window no two scrapes bracket:
    # rate() takes those seconds at the bracketed stretch's rate (extrapolated), or leaves
    # them out (a scrape missed at an edge: a /metrics answer past the 1 s timeout on a
    # saturated box), and the steps in them ran at their own (an epoch's start, a stall:
    # 12.6% off once with 0.58 s of trail and 0.69 s left out, where trail and left out
    # alone allowed 10.6%)
    unbracketed = max(max(0.0, t - b) for t, b in zip(lived, bracketed, strict=True))
    steps = [Store(db).steps(1, since=at - span, until=at) for db in dbs]
    stored = sum(float(s["samples"].sum()) for s in steps) / span
    step = max(float((s["wait_s"] + s["compute_s"]).max()) for s in steps)
    off = unbracketed + step
    print(f"job throughput: PromQL {job:.1f}, stores {stored:.1f} samples/s, "
          f"{abs(job / stored - 1):.1%} off (trail up to {max(trails) + step:.2f} s, "
          f"not bracketed by two scrapes {unbracketed:.2f} s, of {span:.0f}); "
          f"straggler {results[4][0][0]['metric']}: "
          f"{float(results[4][0][0]['value'][1]) * 1000:.1f} ms/step")
    assert job == pytest.approx(stored, rel=max(0.05, off / span))

    # the Job tab's: a rank younger than the window is read over its own age (its counter's
    # created time, its first step), as the store's samples over the part of the window it
    # lived; an older one as the panel's rate
    own = sum(float(s["samples"].sum()) / t for s, t in zip(steps, lived, strict=True))
    print(f"the Job tab: {tab.throughput:.1f} samples/s, the stores over each rank's part of "
          f"the window ({', '.join(f'{t:.1f}' for t in lived)} s): {own:.1f}")
    assert tab.throughput == pytest.approx(own, rel=max(0.05, off / span))
    # each node's page says the job is bigger than what its store holds
    from monitor.ui.view import job_scope

    text, query = job_scope(Store(dbs[1]).ranks(1))
    assert text.startswith("This job has 2 ranks on 2 hosts; this store holds rank 1 "), text
    assert f'job_id="127.0.0.1:{master}"' in query
    assert "monitor dashboard --prometheus URL shows it in this page's Job tab" in text
    assert "the Job tab reads it there" in job_scope(Store(dbs[1]).ranks(1), job_tab=True)[0]


@pytest.mark.xdist_group(jobs.GROUP)
def test_one_node_two_ranks_each_have_their_series(two_rank_job):
    """A one-node torchrun job of two ranks: /metrics has a series per rank, never summed
    (tests/jobs.py scraped it while both ranks stepped)."""
    assert two_rank_job.returncode == 0, two_rank_job.err[-3000:]
    text = two_rank_job.metrics
    assert text, "the endpoint never showed both ranks stepping"
    lines = [ln for ln in text.splitlines() if ln.startswith("starvation_steps_total{")]
    assert len(lines) == 2 and all('local_rank="' in ln and 'job_id="' in ln for ln in lines)


def prometheus_rate(values: list, at: float, span: float) -> tuple[float, float]:
    """rate() of one counter's raw samples in [at - span, at] as Debian's Prometheus 2.42
    computes it (promql/functions.go, extrapolatedRate): the increase between the first and
    last samples, extrapolated back no further than the counter's zero, then toward each
    edge of the window by the gap to it when that gap is under 1.1 average intervals, else
    by half an interval (later releases cap at the zero after the half interval); returns
    the rate and the seconds it covers. A series with one sample in the window has no rate
    (Prometheus drops it: "no sense in trying to compute a rate without at least two points"),
    as a series that ended early in the window has (seen once beside a busy loop: most likely
    a rank's series from before its device was set)."""
    pts = [(float(t), float(v)) for t, v in values]
    if len(pts) < 2:
        return 0.0, 0.0
    (t0, v0), (t1, _) = pts[0], pts[-1]
    inc = sum(b - a if b >= a else b for (_, a), (_, b) in itertools.pairwise(pts))
    sampled = t1 - t0
    avg = sampled / (len(pts) - 1)
    to_start, to_end = t0 - (at - span), at - t1
    if inc > 0 and v0 >= 0:
        to_start = min(to_start, sampled * v0 / inc)
    covered = sampled + sum(d if d < avg * 1.1 else avg / 2 for d in (to_start, to_end))
    return inc * covered / sampled / span, covered
