"""The product's performance figures in one table, each measured here and now (issue 33):
the probe's cost a step and the 1 ms loop (bench/probe_cost.py --table, interleaved rounds),
the first verdict after a run's first steps in `run --live`, the dashboard server's CPU with
one tab and with two, and a 24 h run's whole-run view (bench/ui_tick.py --soak, its server
measured with psutil, the tabs real Chromium), then the 24 h view opened in Chromium
(bench/page_open.py) and the page's first verdict on a job (bench/first_verdict_page.py);
then what the monitor costs around the job (issue 55): what `monitor run` adds to a
3-batch script (bench/run_overhead.py, 5 interleaved pairs), the exporter's CPU a scrape at
8 ranks (bench/scrape_cost.py), and one node of 1/2/4/8 ranks (bench/node_cost.py).

    python bench/figures.py [--rounds 4] [--busy] [--only page|cost]

--busy keeps one core busy meanwhile (a shared machine). Prints each part's own output, then
the table (markdown, for docs/benchmarks.md). Figures only; nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(*args: str, timeout: float = 1200) -> str:
    r = subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=timeout)
    print(r.stdout, flush=True)
    if r.returncode != 0:  # a part that failed says why, and its figures read "?"
        print(f"{args[0]} failed ({r.returncode}): {r.stderr[-1500:]}", flush=True)
    return r.stdout


def first_verdict(tries: int = 3) -> list[float]:
    """Seconds from a run's first stored step to `run --live`'s first verdict line (stderr
    not a terminal: plain lines, stamped here as they arrive)."""
    from monitor.store import Store

    out = []
    for _ in range(tries):
        db = Path(tempfile.mkdtemp()) / "v.db"
        p = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--live", "--db",
                              str(db), "--", sys.executable,
                              str(ROOT / "tests" / "scripts" / "steady_loop.py"), "8"],
                             cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        seen = None
        for ln in p.stderr:
            if seen is None and "throughput" in ln and "judging" not in ln:
                seen = time.time()
        p.wait(120)
        steps = Store(db).steps(1)
        if seen is not None and not steps.empty:
            out.append(seen - float((steps["ts"] - steps["wait_s"]).min()))
    return out


def grab(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    return m.group(1) if m else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    ap.add_argument("--only", choices=("page", "cost"), help="one half of the table")
    a = ap.parse_args()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if a.busy else None
    try:
        if a.only != "cost":
            page_figures(a)
        if a.only != "page":
            cost_figures(a)
    finally:
        if busy is not None:
            busy.kill()


def cost_figures(a: argparse.Namespace) -> None:
    """What the monitor costs around the job (issue 55)."""
    around = run("bench/run_overhead.py", "--pairs", "5", "--steps", "3")
    scrape = run("bench/scrape_cost.py", "--ranks", "8", "--scrapes", "40")
    node = run("bench/node_cost.py", "--ranks", "1,2,4,8", "--seconds", "60", timeout=3600)
    where = "one core kept busy" if a.busy else "quiet box"
    print(f"\n## The monitor's cost around the job ({where}, {time.strftime('%Y-%m-%d')})\n")
    print("| figure | goal | measured |\n|---|---|---|")
    start = grab(r"median added: ([\d.]+) s before", around)
    end = grab(r"s before the script's first line, ([\d.]+) s after", around)
    print(f"| `monitor run` on a 3-batch script: added before its first line | <= 0.3 s | "
          f"{start} s |")
    print(f"| ... and after its last line | <= 0.5 s | {end} s |")
    per = grab(r"CPU per scrape, assessments reused .*: median ([\d.]+ ms)", scrape)
    assessed = grab(r"CPU per scrape, every rank assessed .*: median ([\d.]+ ms)", scrape)
    mean = grab(r"CPU per scrape, mean over .*: ([\d.]+ ms)", scrape)
    print(f"| exporter CPU a scrape, 8 ranks (each rank's assessment reused) | <= 5 ms | "
          f"{per} |")
    print(f"| ... a scrape that assesses every rank (one each 5 s) | | {assessed} |")
    print(f"| ... their mean, scraped every 1 s | | {mean} |")
    print("\nOne node (bench/node_cost.py; goal: under 2% of a core a rank, p99 lag < 1 s, "
          "every step stored):\n")
    print("\n".join(ln for ln in node.splitlines() if ln.startswith("|")))


def page_figures(a: argparse.Namespace) -> None:
    """The probe's cost, the first verdicts, the dashboard's server and its 24 h view."""
    probe = run("bench/probe_cost.py", "--rounds", str(a.rounds), "--table")
    fv = first_verdict()
    print("first verdict in run --live, s after the first step:",
          " ".join(f"{x:.2f}" for x in fv), flush=True)
    tick = run("bench/ui_tick.py", "--hours", "24", "--repeat", "2", "--soak", "15",
               "--tabs", "2")
    opened = run("bench/page_open.py", "--hours", "24", "--repeat", "3", "--busy", "0")
    on_page = run("bench/first_verdict_page.py", "--tries", "3")
    rows = [line for line in probe.splitlines()
            if line.startswith("| ") and not line.startswith("| case ")]
    print(f"\n## Figures ({'one core kept busy' if a.busy else 'quiet box'}, "
          f"{time.strftime('%Y-%m-%d')})\n")
    print("| figure | goal | measured |\n|---|---|---|")
    watch = grab(r"probe cost: ([\d.]+) µs per step", probe)
    print(f"| probe, watch() over an iterator that yields at once | <= 5 µs/step | {watch} "
          "µs/step |")
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        goal = "<= 0.5%" if "1 ms" in cells[0] else \
            "<= 2 µs/step" if "phases" in cells[0] else "<= 5 µs/step"
        print(f"| probe, {cells[0]} | {goal} | {cells[3]} |")
    med = f"{statistics.median(fv):.2f} s ({min(fv):.2f}–{max(fv):.2f})" if fv else "?"
    print(f"| first verdict after the first steps, run --live | <= 2 s | {med} |")
    page = grab(r"first verdict on the page: ([\d.]+ s \([\d.–]+\))", on_page)
    print(f"| first verdict after the first steps, the page (Chromium) | <= 2 s | {page} |")
    one = grab(r"server CPU with 1 tab\(s\): ([\d.]+%)", tick)
    extra = grab(r"each extra tab: ([\d.]+%)", tick)
    view = grab(r"median settled ([\d.]+ s)", opened)
    print(f"| dashboard server, one tab (live page, default workload) | <= 0.05 core | {one} "
          "of a core |")
    print(f"| each further tab | | {extra} of a core |")
    print(f"| 24 h run, whole-run view opened in Chromium (settled) | <= 1 s | {view} |")


if __name__ == "__main__":
    main()
