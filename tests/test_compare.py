"""Runs side by side and the regression gate (`monitor compare`), and retention (`gc`)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.assess.compare import CompareError, compare
from tests.helpers import cli
from tests.test_assess import CONFIG, context, stored_run

ROOT = Path(__file__).resolve().parent.parent



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


def side(run_id: int, thr: float, other: float, runq: float, step: float = 0.06):
    from monitor.assess.compare import Side

    return Side(run_id, f"r{run_id}", {}, {
        "throughput": thr, "throughput_windows": [thr * 0.99, thr, thr * 1.01],
        "evidence": {"other_cpu_cores": other, "loaders_runq_share": runq,
                     "usable_cores": 2, "compute_per_step_s": step}})


def test_a_slower_run_on_a_busier_host_is_inconclusive_not_a_regression():
    from monitor.assess.compare import gate

    quiet, busy = side(1, 142.0, 0.2, 0.02), side(2, 109.0, 1.4, 0.35)
    failed, text = gate(quiet, busy, 5.0)
    assert not failed and text.startswith(
        "inconclusive: run 2's host was busier (other processes 1.4 vs 0.2 cores; loaders "
        "waited 35% vs 2% of their time for a CPU)")
    # the same drop with the host as quiet as before: a regression
    failed, text = gate(quiet, side(2, 109.0, 0.25, 0.03), 5.0)
    assert failed and "a regression beyond 5%" in text
    # a recalibrated simulated device step explains it too
    failed, text = gate(quiet, side(2, 109.0, 0.2, 0.02, step=0.08), 5.0)
    assert not failed and "device step 80 vs 60 ms" in text


def test_resolving_latest_and_names(store):
    first = stored_run(store)
    second = stored_run(store)
    assert store.resolve_run("latest") == second and store.resolve_run("latest~1") == first
    assert store.resolve_run("name:synthetic") == second and store.resolve_run("7") is None


@pytest.mark.slow
def test_gate_fails_a_slower_run_and_knows_a_busier_host(tmp_path, no_leaks):
    """starving at 2 workers, then at 0 (slower on purpose): exit 1, a regression. The same
    settings twice, the second while a process of ours keeps a core busy: slower, but the
    host explains it: not a regression (3, inconclusive, saying why; or 0 within the noise).
    Two runs of the healthy preset (a device-bound step): exit 0."""
    from monitor.config import LoaderConfig
    from monitor.manage.measure import measure as measured
    from monitor.manage.runtime import Runtime

    db = str(tmp_path / "c.db")
    # the five runs come from one Runtime, as `monitor measure` makes each (test_cli.py runs
    # that command itself): later workloads fork from its server, no interpreter each
    rt = Runtime(db).start()

    def measure(preset: str, nw: int) -> None:
        cfg = LoaderConfig.build(preset=preset, num_workers=nw,
                                 step_time_ms=60.0 if preset == "starving" else 100.0)
        m = measured(rt, cfg, 2.0)
        assert m.status == "stopped", m.error

    try:
        for preset, nw in [("starving", 2), ("starving", 0), ("healthy", 0), ("healthy", 0)]:
            measure(preset, nw)
        slower = cli("compare", "1", "2", "--db", db, "--json")
        out = json.loads(slower.stdout)
        if slower.returncode == 3:  # another process took cores meanwhile: said, with figures
            assert out["gate"]["text"].startswith("inconclusive: run 2's host was busier ("), out
        elif slower.returncode == 0 and "faster" in out["gate"]["text"]:
            # 0 workers measured faster: only where run 1's two loaders were measured waiting
            # for a CPU (a saturated host: seen once, 211 against 138 samples/s)
            from monitor.thresholds import RUNQ_CONTENTION_SHARE
            runq = out["host"][0]["loaders_runq_share"] or 0.0
            print(f"run 1's loaders waited {runq:.0%} of their time for a CPU")
            assert runq >= RUNQ_CONTENTION_SHARE, out
        elif slower.returncode == 0:  # a host so loaded that 2 s runs cannot tell: it says so
            m = re.search(r"\(([-+][\d.]+)%\): within the runs' noise ±([\d.]+)%",
                          out["gate"]["text"])
            assert m and abs(float(m.group(1))) <= float(m.group(2)), out["gate"]
        else:
            assert slower.returncode == 1, slower.stderr
            assert out["gate"]["failed"] and "regression" in out["gate"]["text"]
        assert out["settings_diff"]["num_workers"] == [2, 0]
        same = cli("compare", "latest~1", "latest", "--db", db)
        assert "throughput (samples/s)" in same.stdout
        if same.returncode == 3:  # the second's host measured busier (a saturated box: its
            # simulated 100 ms step took 117 ms against 105): said, not called a regression
            assert "inconclusive: run 4's host was busier (" in same.stdout, same.stdout
        else:
            assert same.returncode == 0 and "ok: " in same.stdout, same.stdout + same.stderr
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            measure("starving", 0)
        finally:
            busy.kill()
            busy.wait()
    finally:
        rt.close()
    host = cli("compare", "2", "latest", "--db", db, "--json")
    out = json.loads(host.stdout)
    a, b = out["host"]
    seen = (b["other_cpu_cores"] or 0) - (a["other_cpu_cores"] or 0) >= 0.5 or \
        (b["loaders_runq_share"] or 0) - (a["loaders_runq_share"] or 0) >= 0.10
    if host.returncode == 1:  # only when the host measured no busier: the busy core we added
        assert not seen, out  # went unseen (a machine already saturated by others)
        return
    assert host.returncode in (0, 3), host.stdout + host.stderr
    assert out["gate"]["state"] in ("ok", "inconclusive") and not out["gate"]["failed"]
    if host.returncode == 3:
        assert out["gate"]["text"].startswith("inconclusive: run 5's host was busier ("), out
        strict = cli("compare", "2", "latest", "--db", db, "--strict")
        assert strict.returncode == 1


def test_gc_keeps_running_runs_and_vacuums(store, db_path):
    old = [stored_run(store) for _ in range(3)]
    live = store.create_run("live", "managed", CONFIG.to_dict())
    store.db.conn().execute("UPDATE runs SET ended_at = 1, started_at = 1 WHERE id != ?",
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
