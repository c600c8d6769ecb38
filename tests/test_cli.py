"""`python -m monitor measure`: JSON summary, human summary, refused settings, --help."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for
from tests.helpers import cli

ROOT = Path(__file__).resolve().parent.parent



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
    assert out["accelerator_kind"] == "simulated" and out["window_s"] > 1.0

    from monitor.store import Store

    run = Store(db).run(out["run_id"])
    assert run["status"] == "stopped" and run["config"]["preset"] == "healthy"
    # `run --json` on a script prints the same keys (one builder: monitor/manage/result.py),
    # plus what only an attached script has
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / "r.db"),
                        "--json", "--", sys.executable, str(ROOT / "examples" / "train_small.py"),
                        "--epochs", "1", "--samples", "128", "--batch-size", "32"],
                       capture_output=True, text=True, cwd=ROOT,
                       # 4 steps; a saturated box (load 10 on 2 cores) once took past 180 s
                       timeout=400, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    attached = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out) <= set(attached), set(out) - set(attached)
    assert set(attached) - set(out) <= {"epochs", "evaluation_passes", "retune",
                                        "timing_stopped", "autotune",
                                        "outcomes", "prediction_scales"}, set(attached)
    assert attached["accelerator"] == "your script's own step (cpu)"
    assert attached["gpu"] is None and attached["gpu_util_mean"] is None  # no NVML here


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
    assert not (tmp_path / "m.db").exists()  # refused before anything was created


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
    from monitor.config import LoaderConfig
    from monitor.manage.measure import measure
    from monitor.manage.runtime import Runtime
    from monitor.sampling.gpu.none import NoGpu
    from monitor.sampling.gpu.nvml import NvmlBackend
    from tests.fakes import nvml as fk

    cfg = LoaderConfig.build(preset="healthy", batch_size=8, step_time_ms=10.0)
    with Runtime(store=store, gpu=NvmlBackend(fk.make([fk.FakeGpu(util=80.0)]))) as rt:
        d = measure(rt, cfg, 2.0).to_dict()
    assert d["gpu_util_mean"] == pytest.approx(80.0) and d["gpu_util_cv"] == pytest.approx(0.0)
    with Runtime(store=store, gpu=NoGpu("no NVML here")) as rt:
        plain = measure(rt, cfg, 1.0).to_dict()
    assert plain["gpu_util_mean"] is None and plain["gpu_util_cv"] is None


@pytest.mark.slow
def test_short_real_sweep_json_and_csv(tmp_path, no_leaks):
    db, out_csv = tmp_path / "s.db", tmp_path / "s.csv"
    r = cli("sweep", "--preset", "healthy", "--step-time-ms", "10", "--batch-size", "8",
            "--param", "num_workers=0,1", "--seconds-per-config", "2", "--windows", "2",
            "--json", "--csv", str(out_csv), db=db)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [x["config"]["num_workers"] for x in out["results"]] == [0, 1]
    for x in out["results"]:
        assert x["status"] == "ok" and x["throughput"] > 0 and x["peak_memory_mb"] > 0
        assert x["throughput_spread"] is not None and 0 <= x["data_wait_share"] <= 1
    assert out["best"]["throughput"] == max(x["throughput"] for x in out["results"])
    assert "text" in out["knee"] and out["seconds"] > 0
    assert out_csv.read_text().splitlines()[0].startswith("num_workers,")

    from monitor.store import Store

    runs = Store(db).runs()
    assert len(runs) == 2 and set(runs["status"]) == {"stopped"}


@pytest.mark.slow
def test_tune_runs_the_shared_policy_and_says_where_it_settled(tmp_path, no_leaks):
    """io-bound from num_workers=0: the policy's first move adds workers and pays; the
    answer names the best measured run, every move with its reason, and the settled line."""
    r = cli("tune", "--preset", "io-bound", "--seconds-per-config", "1.5", "--json", db=tmp_path
            / "t.db")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    tried = out["tried"]
    assert tried[0]["config"]["num_workers"] == 0 and out["configs_tried"] == len(tried)
    assert out["moves"] and all(m["reason"] for m in out["moves"])
    assert out["settled"].startswith("settled at num_workers=")
    # the best is the best beyond the noise: a run measured a little higher may not be it
    assert out["throughput"] in [x["throughput"] for x in tried]
    if out["best"]["num_workers"] == 0:
        # a saturated box (CI beside other jobs): no move's gain cleared the noise of its
        # 1.5 s runs (the policy's rule: a gain above MIN_STEP_GAIN and the noise band), and
        # none was kept: the answer withholds, rightly
        from monitor.thresholds import MIN_STEP_GAIN

        for m in out["moves"]:
            gain = m["throughput"] / m["best_before"] - 1
            assert not m["kept"] and (m["failed"] or gain <= max(MIN_STEP_GAIN, m["noise"] or 0)
                                      + 1e-9), m
    else:
        assert out["throughput"] > tried[0]["throughput"]
        assert out["moves"][0]["kept"]
    # a setting is measured once, again when its gain was within the noise of one run
    # (an extension), and the best again when a move ran under another host load (a rematch)
    counts = Counter(json.dumps(x["config"], sort_keys=True) for x in tried)
    assert sum(n - 1 for n in counts.values()) == out["extensions"] + out["rematches"]
    assert max(counts.values()) <= 2 + out["rematches"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sweep_stopped_midway_leaves_nothing_behind(tmp_path, no_leaks, sig):
    db = tmp_path / "s.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STARVATION_MONITOR_SIMULATE": "1"}
    p = subprocess.Popen([sys.executable, "-m", "monitor", "sweep", "--preset", "starving",
                          "--param", "num_workers=0,2,1", "--seconds-per-config", "4",
                          "--db", str(db)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    from monitor.store import Store

    def second_running() -> bool:  # the second configuration has steps
        if not db.exists():
            return False
        runs = Store(db).runs()
        return len(runs) >= 2 and len(Store(db).steps(int(runs["id"].iloc[0]))) >= 3

    wait_for(second_running, timeout=120, every=0.3)
    kids = psutil.Process(p.pid).children(recursive=True)
    assert len(kids) >= 3  # the workload and its two workers
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err
    gone, alive = psutil.wait_procs(kids, timeout=20)
    assert not alive
    store = Store(db)
    runs = store.runs()
    assert len(runs) == 2 and "running" not in set(runs["status"])
    assert store.integrity_ok()
