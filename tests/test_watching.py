"""The page watching a user's job in a real browser: opened on a store with a live attached
run it starts no workload of its own and shows that run; a run started after the page opened
appears and is followed with no click or reload; the banner holds still on a steady run (how
soon each shows is bench/first_verdict_page.py's figure)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from monitor.store import Store
from tests.conftest import shared_browser, wait_for
from tests.test_browser import VERDICT_BANNER, server  # noqa: F401  (the served dashboard)

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def attach(db: Path, seconds: float, name: str, stop: Path | None = None) -> subprocess.Popen:
    """`stop`: a file whose appearance ends the job before its `seconds`; what the job says
    on stderr goes to `<name>.err` beside the store (a failure's message quotes it)."""
    with open(db.parent / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--db", str(db), "--name", name, "--",
             sys.executable, str(ROOT / "tests" / "scripts" / "steady_loop.py"), str(seconds),
             *([str(stop)] if stop else [])],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)


def test_the_page_watches_a_live_job_and_follows_a_new_one(server):  # noqa: F811
    """(The server fixture checks that closing the page leaves no process behind; the jobs
    are ended here.)"""
    from playwright.sync_api import expect

    url, db, proc = server
    first = attach(db, 40, "job-a")
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    assert wait_for(lambda: len(store.steps(1)) >= 20, timeout=90)
    second = None
    try:
        with shared_browser() as browser:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(url)
            expect(page.get_by_text("live: run 1 · job-a · running").first).to_be_visible(
                timeout=60_000)
            banner = page.get_by_text(VERDICT_BANNER).first
            expect(banner).to_be_visible(timeout=30_000)
            # the page started nothing of its own: no managed workload beside the job
            kids = [" ".join(k.cmdline()) for k in psutil.Process(proc.pid).children(True)]
            assert not any("workloads.runner" in c or "workloads.forkserver" in c
                           for c in kids), kids
            assert store.runs()["name"].tolist() == ["job-a"]
            # a steady run: the banner holds its verdict while it is watched; a new verdict
            # must hold a whole KPI window (10 s) before it shows, so in 12 s at most one
            # change (a shared machine's load may really change once), never a flip-flop
            seen: list[str] = []
            end = time.monotonic() + 12
            while time.monotonic() < end:
                v = banner.inner_text().split(" · ")[0]
                if not seen or seen[-1] != v:
                    seen.append(v)
                page.wait_for_timeout(500)
            assert len(seen) <= 2, seen
            # a second job starts: listed and followed without a click or a reload. How soon
            # is a speed goal (2 s: the discovery fragment ticks each second, then the page's
            # rerun; 1.2-1.7 s on a quiet box) measured by bench/first_verdict_page.py, not
            # asserted here: with the cores saturated the server's rerun and the browser's
            # redraw wait for a CPU (4.1, 7.5 and 8.1 s seen beside a busy suite). The
            # deadlines below only tell a page that follows from one that does not.
            second = attach(db, 30, "job-b")
            assert wait_for(lambda: len(store.runs()) == 2, timeout=60)
            t0 = time.monotonic()
            psutil.cpu_percent()  # from here: how busy the cores were while the page worked
            expect(page.get_by_text(re.compile(r"live: run 2 · job-b")).first).to_be_visible(
                timeout=30_000)
            picked = page.locator('[data-testid="stSelectbox"]').filter(has_text="Run")
            expect(picked).to_match_aria_snapshot('- combobox "Run": /run 2 · job-b/',
                                                  timeout=30_000)  # followed
            took, cpu = time.monotonic() - t0, psutil.cpu_percent()
            print(f"run 2 shown and followed {took:.1f} s after its record (cores {cpu:.0f}% "
                  "busy meanwhile)")
            # its first verdict, whichever the evidence supports (on a saturated host it may
            # be warm-up or oversubscribed first; a later one holds 10 s before it shows, so
            # waiting for a particular one times the hold). How soon (5 s asked from its first
            # steps) is bench/first_verdict_page.py's figure; here only that one shows
            # run 2's first step first: its script imports torch on a saturated box (a run
            # once had none 60 s after its record), then its verdict, timed from that step
            assert wait_for(lambda: not store.steps(2).empty, timeout=120), (
                store.run(2), (db.parent / "job-b.err").read_text()[-2000:])
            first_step = float(store.steps(2)["ts"].min())
            verdict = page.get_by_text(VERDICT_BANNER).first
            expect(verdict).to_be_visible(timeout=30_000)
            shown, said = time.time(), verdict.inner_text()
            print(f"run 2's first verdict {shown - first_step:.1f} s after its first step: "
                  f"{said[:80]}")
    finally:
        for job in (first, second):
            if job is not None:
                job.terminate()  # monitor run forwards it to the script's process group
                job.wait(60)
        assert first.returncode is not None and (second is None or second.returncode is not None)


def test_the_run_selector_says_finished_once_the_watched_job_ends(server):  # noqa: F811
    """The selector's label follows the run's status: 'running' while the job runs, then
    'finished' once it ends, with no reload (it kept saying 'running')."""
    from playwright.sync_api import expect

    url, db, _proc = server
    stop = db.parent / "end-the-job"  # ends it once the page has shown it running (a busy
    job = attach(db, 120, "short-job", stop)  # box opened the page after a 6 s job ended)
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    try:
        assert wait_for(lambda: len(store.steps(1)) >= 5, timeout=90)
        with shared_browser() as browser:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(url)
            picked = page.locator('[data-testid="stSelectbox"]').filter(has_text="Run")
            expect(picked).to_match_aria_snapshot(
                '- combobox "Run": /run 1 · short-job · running/', timeout=60_000)
            stop.touch()
            job.wait(90)
            assert wait_for(lambda: store.run(1)["status"] == "finished", timeout=30)
            expect(picked).to_match_aria_snapshot(
                '- combobox "Run": /run 1 · short-job · finished/', timeout=15_000)
    finally:
        if job.poll() is None:
            job.terminate()
            job.wait(60)


def _page_of_a_job(served, script: str, args: list[str], steps: int, check) -> None:
    """Attach `script` (tests/scripts/) to the served store, open the page once it has
    `steps` steps, and run `check(page, expect)` against it; the job is ended after."""
    from playwright.sync_api import expect

    url, db, _proc = served
    job = subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--", sys.executable,
         str(ROOT / "tests" / "scripts" / script), *args], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    try:
        assert wait_for(lambda: len(store.steps(1)) >= steps, timeout=90)
        with shared_browser() as browser:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(url)
            check(page, expect)
    finally:
        job.terminate()
        job.wait(60)


def test_a_loader_that_cannot_be_retuned_says_why_in_the_page(server):  # noqa: F811
    """timm's MultiEpochsDataLoader keeps one iterator for every epoch: the page offers no
    loader controls for it, and says why, instead of taking requests it would refuse."""
    def check(page, expect) -> None:
        expect(page.get_by_text("cannot be re-tuned live: MultiEpochsDataLoader keeps one "
                                "iterator").first).to_be_visible(timeout=60_000)
        assert page.get_by_text("Change the attached script's loader").count() == 0

    _page_of_a_job(server, "loaders.py", ["multi_epochs", "--workers", "1", "--epochs", "400"],
                   5, check)


def test_workers_left_idle_are_named_in_the_page(server):  # noqa: F811
    """A one-shard iterable dataset under 4 workers: the page names the idle workers and
    the fix, not 'add workers'."""
    def check(page, expect) -> None:
        expect(page.get_by_text(re.compile(
            r"idle-workers: 3 of 4 DataLoader workers produced no batch")).first
        ).to_be_visible(timeout=60_000)
        expect(page.get_by_text(re.compile(r"split the data into at least 4 shards")).first
               ).to_be_visible(timeout=10_000)
        # the worker table: worker 0 made every batch, the three others none
        expect(page.get_by_text("DataLoader workers in this window").first
               ).to_be_visible(timeout=10_000)
        # (drawn in the same refresh as the caption above; beside a busy suite a refresh
        # can take several seconds to reach it: CI once saw the caption and not yet the
        # table after 10 s)
        table = page.locator("table", has=page.get_by_text("of batches"))
        expect(table.first).to_be_visible(timeout=30_000)
        # rows in worker order, each: PID, batches, of batches, CPU, USS, state
        rows = [[c.strip() for c in r.split("\t")]
                for r in table.first.locator("tbody tr").all_inner_texts()]
        assert len(rows) == 4 and rows[0][2] == "100%" and int(rows[0][1]) > 0, rows
        assert all(r[1] == "0" and r[2] == "0%" and r[5].startswith("no batch")
                   for r in rows[1:]), rows

    _page_of_a_job(server, "causes.py", ["idle_shards", "--workers", "4", "--seconds", "60"],
                   30, check)


def test_the_step_phases_of_a_job_are_a_stacked_chart_in_the_page(server):  # noqa: F811
    """A script with known forward, backward and optimizer costs: the page draws its steps
    split into their phases, the legend naming each, and the verdict names the largest."""
    def check(page, expect) -> None:
        expect(page.get_by_text("Where each step goes (host time)").first).to_be_visible(
            timeout=60_000)
        for name in ("data wait", "forward", "backward", "optimizer step", "other"):
            expect(page.locator("svg text.legendtext").filter(
                has_text=re.compile(f"^{name}$")).first).to_be_attached(timeout=15_000)
        expect(page.get_by_text(re.compile(r"The step is \d+% backward")).first
               ).to_be_visible(timeout=30_000)

    _page_of_a_job(server, "phases.py", ["--forward-ms", "20", "--backward-ms", "40",
                                         "--optimizer-ms", "10", "--epochs", "40"], 20, check)
