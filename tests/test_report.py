"""`monitor report RUN --html`: one file that opens in Chromium with the network cut off and
shows the page's four charts, the verdict, the advice and the compare against the run
before; text from the store stays text."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.store import Store
from tests.conftest import require, shared_browser
from tests.helpers import cli
from tests.test_assess import CONFIG, stored_run
from tests.test_browser import CHROMIUM, console_errors

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.browser, pytest.mark.slow]



def test_report_opens_offline_with_charts_verdict_and_compare(tmp_path):
    require(CHROMIUM if Path(CHROMIUM).exists() else None, "chromium")
    db = str(tmp_path / "t.db")
    store = Store(db)
    # two stored runs (a starving sawtooth, 20 s each; the second at 2 workers, moved once)
    stored_run(store)
    stored_run(store, config={**CONFIG.to_dict(), "num_workers": 2}, t0=1_700_000_100.0)
    store.add_event(2, "autotune", "num_workers 0→2 (a loader per usable core)",
                    {"num_workers": 2, "rank": 0}, ts=1_700_000_105.0)
    store.update_run(2, name="<b>mine</b> & [link](http://x)")
    for run in (1, 2):  # the runs' own span (stored_run writes steps from its t0)
        steps = store.steps(run)
        store.db.conn().execute("UPDATE runs SET started_at = ?, ended_at = ? WHERE id = ?",
                                (float(steps["ts"].min()) - 0.1,
                                 float(steps["ts"].max()) + 0.1, run))
    r = cli("compare", "1", "2", "--db", db, "--json")
    verdict = json.loads(r.stdout)["kpis"]["verdict"]["values"][1]  # run 2's, as compare says
    out = tmp_path / "share" / "report.html"
    r = cli("report", "latest", "--db", db, "--html", str(out))
    assert r.returncode == 0 and r.stdout.strip() == str(out), r.stderr
    outside: list[str] = []
    with shared_browser() as browser:
        ctx = browser.new_context()
        ctx.route("**/*", lambda route: route.continue_()
                  if route.request.url.startswith("file:")
                  else (outside.append(route.request.url), route.abort()))
        page = ctx.new_page()
        errors = console_errors(page)
        page.goto(out.as_uri())
        page.wait_for_function(
            "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4",
            timeout=30_000)
        charts = page.eval_on_selector_all(".js-plotly-plot", "els => els.map(e => e.id)")
        text = page.inner_text("body")
        bold = page.eval_on_selector_all("h1 b", "els => els.length")
        banner = page.inner_text(".verdict")
    assert charts == ["chart_util", "chart_thr", "chart_wait", "chart_host"]
    assert outside == [] and errors == [], (outside, errors)
    assert "<b>mine</b> & [link](http://x)" in text and bold == 0  # shown as text
    assert banner.startswith(f"{verdict}:"), (banner, verdict)
    assert "Compared with the run before" in text
    assert "run 1" in text and "num_workers: 0 → 2" in text  # the compare's settings diff
    assert "throughput (samples/s)" in text and "Settings and moves" in text
    assert "num_workers 0→2 (a loader per usable core)" in text


def test_report_refuses_a_missing_run_or_store_with_one_line(tmp_path):
    r = cli("report", "1", "--db", str(tmp_path / "none.db"))
    assert r.returncode == 2 and r.stderr.startswith("error: there is no store")
    assert not (tmp_path / "none.db").exists()
    Store(tmp_path / "t.db").close()
    r = cli("report", "latest", "--db", str(tmp_path / "t.db"))
    assert r.returncode == 2 and "no run 'latest'" in r.stderr and "Traceback" not in r.stderr
