"""What one Prometheus scrape of a node's exporter costs, with 8 local ranks of a running job
in the store (each stepping at 50 steps/s, the last minutes recorded, host samples at 4 Hz),
over HTTP as Prometheus scrapes it.

    python bench/scrape_cost.py [--ranks 8] [--scrapes 40] [--minutes 5] [--interval 1]

Figures only: a scrape's wall time; the CPU of answering one on the scraping thread (the
store read, each rank's assessment reused: NOTE [what a scrape reads] in
monitor/export/prometheus.py), and of one with every rank assessed (once every ASSESS_S);
their mean over ASSESS_S at the scrape interval; the CPU of rendering the families with
prometheus-client's encoder and with monitor/export/exposition.py's (the same bytes); and
the exporter's whole CPU (server threads) while scraped every --interval seconds, in cores.
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

from prometheus_client.exposition import choose_encoder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from monitor.config import max_workers  # noqa: E402
from monitor.export.exposition import Families, Renderer  # noqa: E402
from monitor.export.prometheus import ASSESS_S, serve  # noqa: E402
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
        collector, scrapes = exporter.collector, exporter.scrapes
        try:
            body = _scrape(url)  # the first: caches warm
            assessed = []
            for _ in range(5):  # an answer with every rank assessed (one every ASSESS_S)
                collector.assessed.clear()
                c0 = time.thread_time()
                scrapes.answer(FORMAT)
                assessed.append(time.thread_time() - c0)
            reused = []
            for _ in range(a.scrapes):  # within ASSESS_S of the last assessments
                c0 = time.thread_time()
                scrapes.answer(FORMAT)
                reused.append(time.thread_time() - c0)
            families = collector.read()
            encoder = choose_encoder(FORMAT[0])[0]
            client, ours, renderer = [], [], Renderer()
            renderer.render(families, encoder)  # (as served: the label sets kept escaped)
            for _ in range(10):
                c0 = time.thread_time()
                client_text = encoder(Families(families))
                client.append(time.thread_time() - c0)
                c0 = time.thread_time()
                our_text = renderer.render(families, encoder)
                ours.append(time.thread_time() - c0)
            assert client_text == our_text
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
    ms = 1000.0
    per = max(1, round(ASSESS_S / a.interval))  # scrapes in one ASSESS_S
    mean = (statistics.median(assessed) + (per - 1) * statistics.median(reused)) / per
    series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
    print(f"ranks {a.ranks}, {a.minutes:g} min recorded, {a.scrapes} scrapes, "
          f"{series} series, {len(body) / 1024:,.0f} KB a scrape")
    print(f"wall per scrape: median {statistics.median(walls) * ms:,.1f} ms, "
          f"max {max(walls) * ms:,.1f} ms")
    print(f"CPU per scrape, assessments reused (the store read, rendered, gzip): median "
          f"{statistics.median(reused) * ms:,.2f} ms")
    print(f"CPU per scrape, every rank assessed (one every {ASSESS_S:g} s): median "
          f"{statistics.median(assessed) * ms:,.1f} ms")
    print(f"CPU per scrape, mean over {ASSESS_S:g} s scraped every {a.interval:g} s: "
          f"{mean * ms:,.1f} ms")
    print(f"rendering the families: prometheus-client's encoder median "
          f"{statistics.median(client) * ms:,.2f} ms, exposition.py's "
          f"{statistics.median(ours) * ms:,.2f} ms (the same bytes)")
    print(f"exporter CPU while scraped every {a.interval:g} s (HTTP, reads, renders): "
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
