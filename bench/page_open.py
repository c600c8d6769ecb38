"""How long a 24-hour run's whole-run view takes to open in a real browser.

    python bench/page_open.py [--hours 24] [--repeat 3] [--busy 1]

Builds (once, cached under /tmp, as bench/ui_tick.py does) a store holding one ended
synthetic run of --hours (steps at 20 Hz, host samples at 4 Hz), serves the dashboard on it
(no workload), and drives Chromium at 1500x1000: open the page (its 30 s window), then pick
"whole run". Prints, per try, the time from the click to the first chart drawn over the whole
run and to the settled page (every chart redrawn, Streamlit idle), with --busy processes
keeping cores busy meanwhile. Budget: <= 2 s (issue "Faults, round 3"). Figures only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ui_tick import build  # noqa: E402

from tests.conftest import launch  # noqa: E402
from tests.helpers import free_port  # noqa: E402

# the plots whose x axis spans the whole run (milliseconds), and whether Streamlit is idle
SPANS = """() => {
  const out = [];
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    const r = el._fullLayout && el._fullLayout.xaxis && el._fullLayout.xaxis.range;
    if (r) out.push(new Date(r[1]) - new Date(r[0]));
  }
  const busy = !!document.querySelector('[data-testid="stStatusWidget"]');
  return {spans: out, busy: busy};
}"""


def serve(db: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "STARVATION_MONITOR_DB": str(db), "STARVATION_MONITOR_AUTOSTART": "0"}
    p = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port",
                          str(port), "--server.address", "127.0.0.1", "--server.headless",
                          "true"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return p
        except OSError:
            time.sleep(0.2)  # sleep-ok: polling the server's health with a deadline
    p.kill()
    raise SystemExit("the dashboard did not come up in 120 s")


def one(browser, url: str, hours: float) -> tuple[float, float]:
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        page.goto(url)
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg')"
                               ".length >= 4", timeout=120_000)
        whole = hours * 3600e3 * 0.9
        t0 = time.perf_counter()
        page.get_by_text("whole run", exact=True).first.click()
        first = settled = None
        quiet_since = None
        while time.perf_counter() - t0 < 120:
            s = page.evaluate(SPANS)
            over = [x for x in s["spans"] if x >= whole]
            now = time.perf_counter()
            if first is None and over:
                first = now - t0
            if len(over) >= 4 and not s["busy"]:
                quiet_since = quiet_since or now
                if now - quiet_since >= 0.3:  # idle, and stays so
                    settled = quiet_since - t0
                    break
            else:
                quiet_since = None
            page.wait_for_timeout(20)
        return first or float("nan"), settled or float("nan")
    finally:
        page.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--busy", type=int, default=1, help="processes keeping a core busy")
    a = ap.parse_args()
    db = Path(f"/tmp/starvation-page-open-{a.hours:g}h.db")
    t = time.perf_counter()
    build(db, [a.hours])
    print(f"store {db} ({db.stat().st_size / 1e6:.0f} MB) ready in {time.perf_counter() - t:.0f} s")
    port = free_port()
    server = serve(db, port)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    from playwright.sync_api import sync_playwright

    rows = []
    try:
        with sync_playwright() as p:
            browser = launch(p)
            for i in range(a.repeat):
                first, settled = one(browser, f"http://127.0.0.1:{port}", a.hours)
                rows.append((first, settled))
                print(f"try {i + 1}: first whole-run chart {first:.2f} s, settled "
                      f"{settled:.2f} s", flush=True)
            browser.close()
    finally:
        for h in hogs:
            h.kill()
        server.terminate()
        server.wait(30)
    med = statistics.median(r[1] for r in rows)
    print(f"{a.hours:g} h whole-run view, {a.busy} busy core(s): median settled {med:.2f} s "
          f"(first chart {statistics.median(r[0] for r in rows):.2f} s); budget 2 s: "
          f"{'ok' if med <= 2.0 else 'OVER'}")


if __name__ == "__main__":
    main()
