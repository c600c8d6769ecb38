"""Shared fixtures. The suite needs no GPU and no NVIDIA driver; workloads run on the
simulated accelerator (STARVATION_MONITOR_SIMULATE=1 even where CUDA exists)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("STARVATION_MONITOR_SIMULATE", "1")
# NOTE [one intra-op thread in the suite]
# torch's intra-op pool is a thread a CPU, and its OpenMP threads spin at each parallel
# region's barrier. Four pytest workers start torch processes side by side on two cores: a
# pool's second thread is then mostly descheduled, and its sibling spins waiting for it.
# train_small.py's 4 steps took 10-15 CPU-s with the pool and 4.1 with OMP_NUM_THREADS=1,
# on the suite's box (torchrun sets the same for its ranks). The suite's processes get one
# thread; a reproducer of the pool's own cost (tests/scripts/causes.py main_threads) sets
# the default size itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def db_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "monitor.db"
    monkeypatch.setenv("STARVATION_MONITOR_DB", str(path))
    return path


@pytest.fixture
def store(db_path: Path):
    from monitor.store import Store

    s = Store(db_path)
    yield s
    s.close()


SHM_PID = re.compile(r"^(?:torch|__KMP_REGISTERED_LIB)_(\d+)")


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


class PidTracker:
    """Every descendant PID seen while a test runs (polled every 50 ms in a daemon thread),
    so that /dev/shm segments can be traced to this test's processes: torch and Intel's
    OpenMP name theirs by the creating PID. Each poll lists /proc and reads the parent of
    new PIDs only (a full process-tree walk every 50 ms cost more CPU than many tests)."""

    def __init__(self) -> None:
        self.seen: set[int] = {os.getpid()} | descendants()
        self._parent: dict[int, int | None] = {}  # PIDs listed at the last poll -> parent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pid-tracker", daemon=True)
        self._thread.start()

    @staticmethod
    def _ppid(pid: int) -> int | None:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                raw = f.read()
            return int(raw[raw.rfind(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def poll(self) -> None:
        listed = {int(n) for n in os.listdir("/proc") if n.isdigit()}
        parent = {pid: self._parent[pid] if pid in self._parent else self._ppid(pid)
                  for pid in listed}  # a PID gone and reused between two polls is missed
        self._parent = parent
        grew = True
        while grew:  # a new child of a new child: until nothing more joins
            new = {pid for pid, pp in parent.items() if pp in self.seen} - self.seen
            self.seen |= new
            grew = bool(new)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.poll()

    def stop(self) -> set[int]:
        self._stop.set()
        self._thread.join(2)
        return self.seen | descendants()


def wait_for(pred, timeout: float, every: float = 0.1):
    """Poll `pred` until it returns something truthy or `timeout` passes; returns its last
    value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)  # sleep-ok: a poll's interval, under a deadline
    return pred()


@contextlib.contextmanager
def leak_checked(what: str = "the test"):
    """Fails if the block leaves its own child processes or /dev/shm segments behind
    (other processes on a shared machine are not its business)."""
    shm_before = shm_entries()
    kids_before = descendants()
    tracker = PidTracker()
    yield
    wait_for(lambda: not (descendants() - kids_before), timeout=15, every=0.2)
    ours = tracker.stop()
    left = descendants() - kids_before
    assert not left, f"orphan processes left behind by {what}: {left}"
    leaked = {e for e in shm_entries() - shm_before
              if (m := SHM_PID.match(e)) and int(m.group(1)) in ours}
    assert not leaked, f"/dev/shm segments leaked by {what}: {leaked}"


@pytest.fixture
def no_leaks():
    """A test's own processes and /dev/shm segments: none left at its end (leak_checked)."""
    with leak_checked():
        yield


@pytest.fixture(scope="session")
def two_rank_job(tmp_path_factory):
    """tests/jobs.py's two-rank job, run once for the tests that read it (its xdist group,
    `jobs.GROUP`, keeps them on one worker); what `no_leaks` asks of a test's own job is
    asked of it here."""
    from tests import jobs
    from tests.helpers import free_port

    with leak_checked("the two-rank job"):
        return jobs.two_rank_job(tmp_path_factory.mktemp("two-rank-job"), free_port())


CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def require(tool: str | None, package: str) -> str:
    """`tool`'s path (None: not installed). Without it a test is skipped with the command
    that installs it, and fails where CI is set: `make test` installs Debian's chromium and
    prometheus (.ci/test-deps), so a missing one there is a broken set-up, not a skip."""
    if tool is not None and (os.sep not in tool or os.path.exists(tool)):
        return tool
    why = f"{package} is not installed: run `bash .ci/test-deps` (apt-get install -y {package})"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


def launch(playwright):
    """Chromium as the suite and the benches launch it (`playwright` started by the caller)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


class _Browser:
    """The Chromium (and Playwright's driver) shared by consecutive browser tests."""
    playwright: Any = None
    browser: Any = None


@contextlib.contextmanager
def shared_browser():
    """A headless Chromium, launched once for a run of consecutive browser tests (they run
    one after another on one xdist worker: their group) and stopped after the last of them
    (`pytest_runtest_teardown`): a launch and Playwright's driver cost ~2.5 CPU-s, 13 times
    a suite. Each test's pages are its own: a page opened from the browser has a context of
    its own, and every context the block opened is closed at its end. A browser that died
    is launched again. (While Playwright's sync API runs, asyncio counts a loop as running
    in this thread, so it must not outlive the browser tests.)"""
    b = _Browser.browser
    if b is None or not b.is_connected():
        stop_browser()
        from playwright.sync_api import sync_playwright

        pw = sync_playwright().start()
        try:
            b = launch(pw)
        except BaseException:
            pw.stop()
            raise
        _Browser.playwright, _Browser.browser = pw, b
    before = {id(c) for c in b.contexts}
    try:
        yield b
    finally:
        for ctx in b.contexts:
            if id(ctx) not in before:
                with contextlib.suppress(Exception):
                    ctx.close()


def stop_browser() -> None:
    b, pw = _Browser.browser, _Browser.playwright
    _Browser.browser = _Browser.playwright = None
    if b is not None:
        with contextlib.suppress(Exception):
            b.close()
    if pw is not None:
        with contextlib.suppress(Exception):
            pw.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The shared browser stops once the next test is not a browser test (or none)."""
    yield
    if _Browser.playwright is not None and (
            nextitem is None or nextitem.get_closest_marker("browser") is None):
        stop_browser()


def pytest_sessionfinish(session, exitstatus):
    stop_browser()


class _Tmp:
    path: str | None = None


def pytest_unconfigure(config):
    if _Tmp.path is not None:
        shutil.rmtree(_Tmp.path, ignore_errors=True)


@pytest.fixture
def runtime(store):
    """A started Runtime over the test's store, closed after the test."""
    from monitor.manage.runtime import Runtime

    with Runtime(store=store) as rt:
        yield rt


@pytest.fixture
def quiet_page(db_path, monkeypatch):
    """The page under AppTest over the test's store, starting no workload of its own;
    its Runtime is closed after the test."""
    from streamlit.testing.v1 import AppTest

    from monitor.ui.resources import get_runtime

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("STARVATION_MONITOR_AUTOSTART", "0")
    get_runtime.clear()
    yield AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    get_runtime().close()
    get_runtime.clear()



def pytest_configure(config):
    """The suite gets a temporary folder of its own, TMPDIR for the processes the tests start
    (not for tmp_path), removed at its end: torchrun leaves its torchelastic_* folder, W&B's
    offline service its wandb-* and MLflow's server its db_init_lock-* in the system's
    temporary folder (each does so run bare): ~30 a suite. A product's leak that a test looks
    for is still there while the test runs.

    A suite started from a shell without job control (`(make test &)`, a script's
    background job) inherits SIGINT ignored, and one started under `nohup` SIGHUP; an
    ignored signal stays ignored across exec, so every process the tests start would shrug
    off the signals they send it (seen: the SIGINT and SIGHUP tests timed out, a sweep
    exited 0 instead of 130). The defaults are restored here, in the controller and in each
    xdist worker, so the children start with them."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # (the workers inherit the controller's)
        tempfile.tempdir = tempfile.gettempdir()  # this process's own (tmp_path's) stays
        _Tmp.path = tempfile.mkdtemp(prefix="smt-")  # short: AF_UNIX paths end at 108 bytes
        os.environ["TMPDIR"] = _Tmp.path
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGHUP, signal.SIGTERM):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


@pytest.hookimpl(tryfirst=True)  # the group marks must be there before xdist reads them
def pytest_collection_modifyitems(config, items):
    """Browser tests run one after another on one xdist worker (`--dist loadgroup`: two
    Chromiums and their pages side by side starve each other on two cores). `gpu` tests run
    only where CUDA is there (torch is imported only to ask when one was collected);
    elsewhere they are skipped, saying why."""
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.xdist_group("browser"))
    gpu = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA (none here)")
    for item in gpu:
        item.add_marker(skip)
