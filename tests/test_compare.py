"""Runs side by side and the regression gate (`monitor compare`), and retention (`gc`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.assess.compare import CompareError, compare
from tests.test_assess import CONFIG, context, stored_run

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monitor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               "STARVATION_MONITOR_SIMULATE": "1"})


def test_settings_diff_kpi_deltas_and_the_gate(store):
    a = stored_run(store)
    b = stored_run(store, config=CONFIG.replace(num_workers=2).to_dict())
    out = compare(store, [str(a), str(b)], context(), max_regression_pct=5)
    assert out["settings_diff"] == {"num_workers": [0, 2], "prefetch_factor": [None, 2]}
    assert out["settings_same"]["batch_size"] == 32
    assert out["kpis"]["throughput"]["delta"] == [0.0, 0.0]
    assert not out["gate"]["failed"]  # identical steps: no regression
    with pytest.raises(CompareError, match="no run 'name:nope'"):
        compare(store, [str(a), "name:nope"], context())


def test_resolving_latest_and_names(store):
    first = stored_run(store)
    second = stored_run(store)
    assert store.resolve_run("latest") == second and store.resolve_run("latest~1") == first
    assert store.resolve_run("name:synthetic") == second and store.resolve_run("7") is None


@pytest.mark.slow
def test_gate_fails_a_slower_run_and_passes_the_same_settings(tmp_path, no_leaks):
    """starving at 2 workers, then at 0 (slower on purpose): exit 1. Two runs of the healthy
    preset (a device-bound step, steady whatever else the machine does): exit 0."""
    db = str(tmp_path / "c.db")
    runs = [("starving", "2"), ("starving", "0"), ("healthy", "0"), ("healthy", "0")]
    for preset, nw in runs:
        r = cli("measure", "--preset", preset, "--num-workers", nw, "--seconds", "4",
                "--step-time-ms", "60" if preset == "starving" else "100", "--db", db)
        assert r.returncode == 0, r.stderr
    slower = cli("compare", "1", "2", "--db", db, "--json")
    assert slower.returncode == 1, slower.stderr
    out = json.loads(slower.stdout)
    assert out["gate"]["failed"] and "regression" in out["gate"]["text"]
    assert out["settings_diff"]["num_workers"] == [2, 0]
    same = cli("compare", "latest~1", "latest", "--db", db)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "ok: " in same.stdout and "throughput (samples/s)" in same.stdout


def test_gc_keeps_running_runs_and_vacuums(store, db_path):
    old = [stored_run(store) for _ in range(3)]
    live = store.create_run("live", "managed", CONFIG.to_dict())
    store._conn().execute("UPDATE runs SET ended_at = 1, started_at = 1 WHERE id != ?",
                          (live,))  # ended long ago
    removed, before, after = store.gc(keep_days=1)
    assert removed == old and after < before
    assert store.runs()["id"].tolist() == [live] and store.steps(old[0]).empty
    assert store.integrity_ok()
    r = cli("gc", "--db", str(db_path))
    assert r.returncode == 2 and "--keep-days" in r.stderr


def test_compare_tab_one_click_from_the_live_page(store, no_leaks, quiet_page):
    a = stored_run(store)
    b = stored_run(store, config=CONFIG.replace(num_workers=2).to_dict())
    at = quiet_page
    at.run()
    assert at.selectbox(key="selected_run").value == b
    at.button(key="compare_previous").click().run()
    assert not at.exception
    assert at.multiselect(key="compare_runs").value == [a, b]
    diff, kpis = (d.value for d in at.dataframe)  # the tab's two tables, in order
    assert list(diff.index) == ["num_workers", "prefetch_factor"]
    assert list(kpis.columns) == [f"run {a}", f"run {b}"]
    assert kpis.loc["throughput (samples/s)", f"run {b}"].endswith("(+0.0%)")
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert any("aligned at each run" in s for s in specs)
    assert any("share of steps at or below" in s for s in specs)
    assert any("within" in s.value for s in at.success)  # the gate's sentence
