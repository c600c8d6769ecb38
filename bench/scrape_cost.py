"""What one Prometheus scrape of a node's exporter costs, with 8 local ranks of a running job
in the store (each stepping at 50 steps/s, the last minutes recorded, host samples at 4 Hz),
over HTTP as Prometheus scrapes it.

    python bench/scrape_cost.py [--ranks 8] [--scrapes 40] [--minutes 5] [--interval 1]

Figures only: a scrape's wall time; the CPU of rendering one (the scraping thread's, the
snapshot fresh: NOTE [scrape from a snapshot] in monitor/export/prometheus.py); the CPU of
one snapshot build with every rank assessed (what each scrape cost before the snapshot);
and the exporter's whole CPU (server threads and its snapshot loop) while scraped every
--interval seconds, in cores.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from monitor.config import max_workers  # noqa: E402
from monitor.export.prometheus import serve  # noqa: E402
from monitor.manage.context import Context  # noqa: E402
from monitor.records import HostSample, StepRecord  # noqa: E402
from monitor.sampling.budget import cpu_budget, usable_cores  # noqa: E402
from monitor.store import ATTACHED, Store  # noqa: E402

# what Prometheus 2.x/3.x sends with a scrape
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,"
                     "application/openmetrics-text;version=0.0.1;q=0.4,"
                     "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
FORMAT = (PROMETHEUS_ACCEPT, True)


def fill(db: Path, ranks: int, minutes: float) -> None:
    store = Store(db)
    run = store.create_run("attached:train.py", ATTACHED, {"num_workers": 2, "batch_size": 32})
    store.update_run(run, pid=os.getpid(), accelerator_kind="cpu")
    now = time.time()
    t0 = now - minutes * 60
    for r in range(ranks):
        store.set_rank(run, r, r, ranks * 4, "node-a", os.getpid(), {"num_workers": 2},
                       "cpu", job_id="job-1", node_rank=0, nodes=4)
        steps, t, i = [], t0, 0
        while t < now:
            wait = 0.004 + (0.02 if r == 3 else 0.0)
            t += wait + 0.016
            steps.append(StepRecord(run, i, i // 1000, t, wait, 0.016, 32, 0, rank=r))
            i += 1
        store.insert(steps)
    n = int((now - t0) * 4)
    store.insert([HostSample(ts=t0 + k * 0.25, run_id=run, cpu_total_pct=60.0,
                             cpu_per_core=json.dumps([60.0, 60.0]), mem_used_mb=4000.0,
                             mem_total_mb=24000.0, mem_available_mb=20000.0,
                             shm_used_mb=1.0, proc_cpu_pct=95.0, proc_rss_mb=300.0,
                             workers=2 * ranks, workers_cpu_pct=80.0, workers_rss_mb=900.0,
                             workers_uss_mb=200.0) for k in range(n)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=40)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=1.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "s.db"
        fill(db, a.ranks, a.minutes)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        exporter = serve(str(db), Context(cpu_budget(), max_workers(usable_cores())), port)
        url = f"http://127.0.0.1:{port}/metrics"
        collector, snapshots = exporter.collector, exporter.snapshots
        try:
            body = _scrape(url)  # the first: caches warm
            builds = []
            for _ in range(5):  # a build with every rank assessed (each scrape's, before)
                collector.assessed.clear()
                c0 = time.thread_time()
                snapshots.build()
                builds.append(time.thread_time() - c0)
            reused = []
            for _ in range(5):  # a build within ASSESS_S of the last assessments
                c0 = time.thread_time()
                snapshots.build()
                reused.append(time.thread_time() - c0)
            renders = []
            for _ in range(a.scrapes):
                c0 = time.thread_time()
                snapshots.answer(FORMAT)
                renders.append(time.thread_time() - c0)
            walls = []
            c0, w0 = time.process_time(), time.monotonic()
            for k in range(a.scrapes):
                t = time.perf_counter()
                body = _scrape(url)
                walls.append(time.perf_counter() - t)
                _until(w0 + (k + 1) * a.interval)
            cores = (time.process_time() - c0) / (time.monotonic() - w0)
        finally:
            exporter.shutdown()
            exporter.server_close()
    series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
    print(f"ranks {a.ranks}, {a.minutes:g} min recorded, {a.scrapes} scrapes, "
          f"{series} series, {len(body) / 1024:,.0f} KB a scrape")
    print(f"wall per scrape: median {statistics.median(walls) * 1000:,.1f} ms, "
          f"max {max(walls) * 1000:,.1f} ms")
    print(f"CPU per scrape (the counters read and rendered, then the snapshot's bytes; "
          f"gzip): median {statistics.median(renders) * 1000:,.2f} ms")
    print(f"CPU per snapshot build, every rank assessed (a scrape's before the snapshot): "
          f"median {statistics.median(builds) * 1000:,.1f} ms")
    print(f"CPU per snapshot build, assessments reused (4 builds in 5): "
          f"median {statistics.median(reused) * 1000:,.1f} ms")
    print(f"exporter CPU while scraped every {a.interval:g} s (HTTP, renders, its loop): "
          f"{cores:.3f} cores")


def _scrape(url: str) -> bytes:
    """One scrape as Prometheus sends it (its Accept header, gzip); the text."""
    req = urllib.request.Request(url, headers={"Accept": PROMETHEUS_ACCEPT,
                                               "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
        return gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body


def _until(t: float) -> None:
    """Wait until monotonic time t (the scrape interval)."""
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


if __name__ == "__main__":
    main()
