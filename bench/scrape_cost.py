"""What one Prometheus scrape of a node's exporter costs, with 8 local ranks of a running job
in the store (each stepping at 50 steps/s, the last minutes recorded, host samples at 4 Hz):
wall time and the exporter process's CPU per scrape, over HTTP as Prometheus scrapes it.

    python bench/scrape_cost.py [--ranks 8] [--scrapes 40] [--minutes 5]

Figures only. Every scrape reads each rank's recent window and assesses it (the verdict with
the page's hysteresis), so the cost grows with the local ranks, not with the job's size.
"""
from __future__ import annotations

import argparse
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
from monitor.sampling.host import cpu_budget, usable_cores  # noqa: E402
from monitor.store import ATTACHED, Store  # noqa: E402


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
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "s.db"
        fill(db, a.ranks, a.minutes)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = serve(str(db), Context(cpu_budget(), max_workers(usable_cores())), port)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            body = urllib.request.urlopen(url, timeout=30).read()  # the first: caches warm
            walls, cpus = [], []
            for _ in range(a.scrapes):
                c0, w0 = time.process_time(), time.perf_counter()
                body = urllib.request.urlopen(url, timeout=30).read()
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
        finally:
            stop = getattr(server, "shutdown", None) or getattr(server, "stop", None)
            if stop:
                stop()
    series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
    print(f"ranks {a.ranks}, {a.minutes:g} min recorded, {a.scrapes} scrapes, "
          f"{series} series, {len(body) / 1024:,.0f} KB a scrape")
    print(f"wall per scrape: median {statistics.median(walls) * 1000:,.1f} ms, "
          f"max {max(walls) * 1000:,.1f} ms")
    print(f"exporter CPU per scrape (this process, server threads included): median "
          f"{statistics.median(cpus) * 1000:,.1f} ms")


if __name__ == "__main__":
    main()
