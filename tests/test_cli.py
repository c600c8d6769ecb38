"""`python -m monitor measure`: JSON summary, human summary, refused settings, --help."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, db: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STARVATION_MONITOR_SIMULATE": "1"}
    return subprocess.run([sys.executable, "-m", "monitor", *args, "--db", str(db)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.slow
def test_measure_json_last_line_has_the_summary(tmp_path, no_leaks):
    db = tmp_path / "m.db"
    r = cli("measure", "--preset", "healthy", "--num-workers", "0", "--seconds", "3",
            "--json", db=db)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("run_id", "throughput", "data_wait_share", "device_busy_mean",
                "device_busy_cv", "steps", "verdict"):
        assert key in out
    assert out["steps"] > 5 and out["throughput"] > 0
    assert 0 <= out["data_wait_share"] <= 1 and out["verdict"] == "healthy"
    assert set(out["bound"]) >= {"throughput", "limit"} and out["bound"]["limit"] == "device"
    assert isinstance(out["advice"], list)
    assert out["status"] == "stopped" and db.exists()

    from monitor.store import Store

    run = Store(db).run(out["run_id"])
    assert run["status"] == "stopped" and run["config"]["preset"] == "healthy"


@pytest.mark.slow
def test_measure_human_summary_and_failure_exit(tmp_path, monkeypatch):
    monkeypatch.setenv("STARVATION_MONITOR_FAULT_AT", "2")
    r = cli("measure", "--preset", "healthy", "--seconds", "2", db=tmp_path / "m.db")
    assert r.returncode == 1
    assert "failed" in r.stdout and "injected fault at sample 2" in r.stderr


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--num-workers", "-1"], "num_workers=0"),
        (["--batch-size", "0"], "batch_size=0"),
        (["--prefetch-factor", "4"], "set num_workers >= 1"),
        (["--seconds", "0"], "--seconds must be positive"),
    ],
)
def test_invalid_settings_exit_nonzero_with_a_hint(tmp_path, args, msg):
    r = cli("measure", *args, db=tmp_path / "m.db", timeout=60)
    assert r.returncode == 2 and msg in r.stderr
    assert not (tmp_path / "m.db").exists() or "error" in r.stderr


def test_help_explains_every_flag(tmp_path):
    r = cli("measure", "--help", db=tmp_path / "m.db", timeout=60)
    assert r.returncode == 0
    for flag in ("--preset", "--num-workers", "--batch-size", "--prefetch-factor",
                 "--pin-memory", "--persistent-workers", "--seconds", "--json", "--db"):
        assert flag in r.stdout


@pytest.mark.slow
def test_measure_reports_nvml_utilization_when_present(store, no_leaks):
    """gpu_util_mean/cv come from NVML's samples over the measured window (here a scripted
    NVML reporting a flat 80%), and are None without NVML."""
    from monitor.collector import Collector
    from monitor.config import LoaderConfig
    from monitor.gpu.nvml import NvmlBackend
    from monitor.measure import measure
    from tests import fake_nvml as fk

    cfg = LoaderConfig.build(preset="healthy", batch_size=8, step_time_ms=10.0)
    col = Collector(store, gpu=NvmlBackend(fk.make([fk.FakeGpu(util=80.0)]))).start()
    try:
        m = measure(store, cfg, 2.0, collector=col)
    finally:
        col.stop()
    d = m.to_dict()
    assert d["gpu_util_mean"] == pytest.approx(80.0) and d["gpu_util_cv"] == pytest.approx(0.0)
    plain = measure(store, cfg, 1.0).to_dict()
    assert plain["gpu_util_mean"] is None and plain["gpu_util_cv"] is None
