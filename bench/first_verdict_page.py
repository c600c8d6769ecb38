"""How soon the page shows a verdict for a user's job: seconds from the job's first step to
the banner's first verdict, in a real browser watching the store.

    python bench/first_verdict_page.py [--tries 3] [--busy]

Serves the dashboard with no workload of its own (`STARVATION_MONITOR_AUTOSTART=0`, as
`dashboard --watch`), opens it in Chromium at 1500x1000, then starts `monitor run` on
tests/scripts/steady_loop.py (a starving loop of 12 ms steps) and polls the page for the
verdict banner. The first step is the run's first stored step's request time (its `ts` less
its wait). --busy keeps one core busy meanwhile (a shared machine). Goal (issue 33): <= 2 s.
Figures only.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from monitor.store import Store  # noqa: E402
from tests.conftest import launch  # noqa: E402
from tests.test_browser import VERDICT_BANNER, serve_dashboard  # noqa: E402


def one_try() -> float | None:
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp())
    with serve_dashboard(tmp, {"STARVATION_MONITOR_AUTOSTART": "0"}) as (url, db, _proc), \
            sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(url)
        page.wait_for_selector('[data-testid="stApp"]', timeout=60_000)
        job = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--db", str(db), "--", sys.executable,
             str(ROOT / "tests" / "scripts" / "steady_loop.py"), "20"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen = None
        deadline = time.monotonic() + 60
        banner = page.get_by_text(VERDICT_BANNER).first
        while seen is None and time.monotonic() < deadline:
            if banner.count() and banner.is_visible():
                seen = time.time()
            else:
                page.wait_for_timeout(50)
        job.wait(120)
        browser.close()
        steps = Store(db).steps(1)
        if seen is None or steps.empty:
            return None
        return seen - float((steps["ts"] - steps["wait_s"]).min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    a = ap.parse_args()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if a.busy else None
    got = []
    try:
        for i in range(a.tries):
            s = one_try()
            print(f"try {i}: " + (f"{s:.2f} s from the first step to the page's verdict"
                                  if s is not None else "no verdict within 60 s"), flush=True)
            if s is not None:
                got.append(s)
    finally:
        if busy is not None:
            busy.kill()
    if got:
        print(f"first verdict on the page: {statistics.median(got):.2f} s "
              f"({min(got):.2f}–{max(got):.2f}) after the first step, {len(got)} tries"
              + (", one core kept busy" if a.busy else ""))


if __name__ == "__main__":
    main()
