"""What a page does on its own, in a real browser: served by `starvation-monitor dashboard`
from a folder outside the checkout (as a pip-installed user runs it) it requests no host
but the one serving it and prints nothing of usage statistics; watching a job it did not
start it shows that job's settings, never the demo's sliders or Start; and no page changes a
run without a user's move (NOTE [no change without a move] in monitor/ui/controls.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from monitor.config import LoaderConfig
from monitor.store import Store
from monitor.ui.controls import shown_step_ms
from tests.conftest import CHROMIUM, require, shared_browser, wait_for
from tests.test_browser import VERDICT_BANNER, serve_dashboard

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _record_hosts(page) -> list[str]:
    """Every URL the page asks for (documents, scripts, fonts, fetches, websockets)."""
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.on("websocket", lambda w: urls.append(w.url))
    return urls


def test_watching_from_another_folder_sends_nothing_and_shows_the_jobs_settings(tmp_path):
    from playwright.sync_api import expect

    require(CHROMIUM if Path(CHROMIUM).exists() else None, "chromium")
    elsewhere = tmp_path / "elsewhere"  # no .streamlit/ here: the command must say it all
    elsewhere.mkdir()
    db = tmp_path / "monitor.db"
    job = subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--name", "two-workers",
         "--", sys.executable, str(ROOT / "tests" / "scripts" / "steady_loop.py"), "90"],
        cwd=ROOT, env={**os.environ, "STEADY_WORKERS": "2"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: db.exists() and len(Store(db).steps(1)) >= 20, timeout=90)
        cmd = [sys.executable, "-m", "monitor", "dashboard", "--watch", "--db", str(db),
               "--port", "{port}"]
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        with serve_dashboard(tmp_path, env, command=cmd, cwd=elsewhere) as (url, _, proc), \
                shared_browser() as browser:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            urls = _record_hosts(page)
            page.goto(url)
            sidebar = page.locator('[data-testid="stSidebar"]')
            expect(sidebar.get_by_text("Run 1", exact=True)).to_be_visible(timeout=60_000)
            expect(sidebar.get_by_text("num_workers: 2")).to_be_visible(timeout=30_000)
            expect(page.get_by_text("live: run 1 · two-workers · running").first) \
                .to_be_visible(timeout=30_000)
            # the live region has refreshed (its verdict shows), then what it asked for
            expect(page.get_by_text(VERDICT_BANNER).first).to_be_visible(timeout=60_000)
            assert sidebar.get_by_role("button", name="Start").count() == 0
            assert page.get_by_role("button", name="Start").count() == 0
            assert sidebar.get_by_role("slider").count() == 0, "the demo's sliders show"
            assert page.get_by_text("Deploy", exact=True).count() == 0
            hosts = {urlsplit(u).hostname for u in urls}
            assert hosts == {"127.0.0.1"}, sorted(u for u in urls if "127.0.0.1" not in u)
        log = (tmp_path / "server.log").read_text()
        assert "usage statistics" not in log.lower(), log
    finally:
        job.terminate()
        job.wait(60)


def test_pages_opened_at_a_runs_start_change_nothing(tmp_path):
    """Two pages on the demo's first seconds, one of them opened before the step's
    calibration is stored (the sidebar then shows the preset's default step, and the
    calibrated one a moment later): neither may change the run."""
    require(CHROMIUM if Path(CHROMIUM).exists() else None, "chromium")
    with serve_dashboard(tmp_path) as (url, db, _), shared_browser() as browser:
        first = browser.new_page()
        first.goto(url)  # an empty store: the page starts the demo
        assert wait_for(db.exists, timeout=60)
        store = Store(db)
        assert wait_for(lambda: not store.runs().empty, timeout=60)
        calibrated = wait_for(lambda: store.calibration("sample_cost_s:starving"), timeout=90)
        assert calibrated, "the starving preset never stored its calibration"
        second = browser.new_page()
        second.goto(url)
        cfg = LoaderConfig.from_dict(store.run(1)["config"] or {})
        step = str(shown_step_ms(cfg, store))  # what both sidebars come to show

        def slider_step(page) -> str | None:
            s = page.locator('[data-testid="stSlider"]').filter(has_text="step time") \
                .locator('[data-testid="stSliderThumbValue"]')
            return s.first.inner_text() if s.count() else None

        def shows_step(page) -> bool:
            return slider_step(page) == step
        # both pages redraw their sidebars onto the calibrated step, and the run goes on
        steps_then = len(store.steps(1))
        assert wait_for(lambda: shows_step(first) and shows_step(second), timeout=60), (
            step, slider_step(first), slider_step(second),
            store.events(1, kinds=("config",))["label"].tolist())
        assert wait_for(lambda: len(store.steps(1)) > steps_then + 20, timeout=120)
        moved = store.events(1, kinds=("config",))["label"].tolist()
        assert moved == ["start"], moved  # the run's start, and no change after it
        asked = store.control_requests(1, limit=100)
        assert not (asked["kind"] == "config").any(), asked.to_dict("records")
