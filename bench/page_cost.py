"""What watching costs the watched job: a training script's own throughput under
`monitor run` with the dashboard open on it (served with --watch, a real Chromium tab on the
run) against the same with no page, in interleaved pairs of equal length.

    python bench/page_cost.py [--pairs 3] [--seconds 20]

Each run is `monitor run -- python tests/scripts/steady_loop.py SECONDS` (a starving loop,
the same every window); its throughput is the run's steady state from the store. Prints each
pair (their order alternating) and the median difference. Goal (issue "The page watches the
user's job"): within 3%.
Figures only.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.conftest import launch  # noqa: E402
from tests.helpers import free_port  # noqa: E402


def job(db: Path, seconds: float) -> float:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        "--no-live", "--", sys.executable,
                        str(ROOT / "tests" / "scripts" / "steady_loop.py"), str(seconds)],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return float(json.loads(r.stdout.strip().splitlines()[-1])["throughput"])


def with_page(db: Path, seconds: float) -> float:
    """The job while a served dashboard (watch only) shows it in Chromium."""
    import threading
    import urllib.request

    port = free_port()
    env = {**os.environ, "STARVATION_MONITOR_DB": str(db)}
    server = subprocess.Popen([sys.executable, "-m", "monitor", "dashboard", "--watch",
                               "--port", str(port), "--db", str(db)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from playwright.sync_api import sync_playwright

    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
                break
            except OSError:
                threading.Event().wait(0.2)
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}")
            out: list[float] = []
            t = threading.Thread(target=lambda: out.append(job(db, seconds)))
            t.start()  # the page follows the new run by itself
            while t.is_alive():
                page.wait_for_timeout(500)
            browser.close()
        return out[0]
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    diffs = []
    for i in range(a.pairs):
        d = Path(tempfile.mkdtemp())
        if i % 2 == 0:  # the order alternates: neither side always runs first
            bare = job(d / "bare.db", a.seconds)
            watched = with_page(d / "watched.db", a.seconds)
        else:
            watched = with_page(d / "watched.db", a.seconds)
            bare = job(d / "bare.db", a.seconds)
        diffs.append(watched / bare - 1)
        print(f"pair {i + 1}: no page {bare:,.1f} samples/s, page open {watched:,.1f} "
              f"({diffs[-1]:+.1%})", flush=True)
    med = statistics.median(diffs)
    print(f"median: {med:+.1%} with the page open (goal: within 3%: "
          f"{'ok' if abs(med) <= 0.03 else 'OVER'})")


if __name__ == "__main__":
    main()
