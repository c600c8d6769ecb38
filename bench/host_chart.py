"""The Host chart's cost on a box with many cores: traces, figure JSON a refresh, and the time
Chromium's Plotly takes to redraw it (Plotly.react on a new 30 s window, as a refresh does).

    python bench/host_chart.py [--cores 2,16,64,192] [--repeat 5]

Host samples at 4 Hz with random per-core loads. Figures only: a GPU node's CPU has 16-224
cores, and the page refreshes its charts every 1-2 s on the box that runs the job.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from monitor.ui import charts  # noqa: E402
from tests.conftest import launch  # noqa: E402

REDRAW = """async (figs) => {
  figs = JSON.parse(figs);
  const el = document.getElementById('g');
  await Plotly.newPlot(el, figs[0].data, figs[0].layout);
  const took = [];
  for (let i = 1; i < figs.length; i++) {
    const t0 = performance.now();
    await Plotly.react(el, figs[i].data, figs[i].layout);
    took.push(performance.now() - t0);
  }
  return took;
}"""


def host(cores: int, seconds: float, seed: int) -> pd.DataFrame:
    t = time.time() - seconds + np.arange(int(seconds * 4)) / 4
    rng = np.random.default_rng(seed)
    rows = np.round(rng.uniform(0, 100, (len(t), cores)), 1)
    return pd.DataFrame({  # each row with its three core figures, as the sampler stores them
        "ts": t, "cpu_per_core": [json.dumps(r.tolist()) for r in rows],
        "cpu_busiest_core_pct": rows.max(axis=1), "cpu_median_core_pct": np.median(rows, axis=1),
        "cpu_idlest_core_pct": rows.min(axis=1),
        "mem_used_mb": 1000.0, "shm_used_mb": 10.0, "proc_rss_mb": 500.0, "workers": 2,
        "workers_cpu_pct": 50.0, "workers_rss_mb": 300.0})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="2,16,64,192")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    import plotly
    from playwright.sync_api import sync_playwright

    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 600, "height": 600})
        page.set_content("<div id=g style='width:500px;height:480px'></div>")
        page.add_script_tag(path=str(js))
        print("| cores | traces | figure JSON | Plotly.react in Chromium, median (range) |\n"
              "|---|---|---|---|")
        for n in (int(x) for x in a.cores.split(",")):
            t = time.perf_counter()
            figs = [charts.host_figure(host(n, 30.0 + k, k)) for k in range(a.repeat + 1)]
            build = (time.perf_counter() - t) / len(figs)
            sizes = [len(f.to_json()) for f in figs]
            took = page.evaluate(REDRAW, json.dumps([f.to_plotly_json() for f in figs],
                                                    default=lambda o: o.tolist()))
            print(f"| {n} | {len(figs[0].data)} | {statistics.median(sizes) / 1000:.0f} KB "
                  f"(built in {build * 1000:.0f} ms) | {statistics.median(took):.0f} ms "
                  f"({min(took):.0f}-{max(took):.0f}) |", flush=True)
        browser.close()


if __name__ == "__main__":
    main()
