"""Shared fixtures. The suite needs no GPU and no NVIDIA driver; workloads run on the
simulated accelerator (STARVATION_MONITOR_SIMULATE=1 even where CUDA exists)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("STARVATION_MONITOR_SIMULATE", "1")


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


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves child processes or /dev/shm entries behind."""
    shm_before = shm_entries()
    kids_before = descendants()
    yield
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = descendants() - kids_before
        if not left:
            break
        time.sleep(0.2)
    left = descendants() - kids_before
    assert not left, f"orphan processes left behind: {left}"
    leaked = {e for e in shm_entries() - shm_before if e.startswith(("torch_", "__KMP"))}
    assert not leaked, f"/dev/shm segments leaked: {leaked}"
