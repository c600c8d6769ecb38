"""The SQLite store: schema, WAL, batched inserts, window queries, run lifecycle, control."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

from monitor.records import GpuSample, GpuUtilSample, HostSample, StepRecord
from monitor.sampling.gpu.nvml import _blank
from monitor.store import Store


def _steps(run_id: int, n: int, t0: float = 100.0) -> list[StepRecord]:
    return [StepRecord(run_id, i, 0, t0 + i * 0.1, 0.03, 0.07, 8, 0) for i in range(n)]


def test_wal_mode_and_tables(store):
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "steps", "host_samples", "gpu_samples", "events", "control"} <= tables


def test_steps_window_query_returns_frames(store):
    run = store.create_run("starving", "managed", {"num_workers": 0})
    assert store.insert(_steps(run, 50)) == 50
    df = store.steps(run, since=101.0, until=102.0)
    assert list(df["step"]) == list(range(10, 21))
    assert set(df.columns) >= {"ts", "wait_s", "compute_s", "samples", "epoch", "config_seq"}
    assert store.steps(run + 1).empty


def test_host_and_gpu_samples_round_trip(store):
    store.insert([HostSample(1.0, None, 50.0, "[40.0, 60.0]", 1000.0, 2000.0, 900.0, 1.0,
                             None, None, None, None, None)])
    store.insert([GpuUtilSample(1.0, 0, 97.0, "samples"), GpuUtilSample(1.1, 1, None, "rates")])
    store.insert([GpuSample(**{**_blank(1.0, 0), "power_w": 300.0}),
                  GpuSample(**{**_blank(1.0, 1), "lost": 1})])
    h = store.host_samples(0.0)
    assert h["cpu_total_pct"].iloc[0] == 50.0 and h["proc_rss_mb"].isna().all()
    u = store.gpu_util(0.0)
    assert list(u["gpu"]) == [0, 1] and u["util_pct"].isna().tolist() == [False, True]
    g = store.gpu_samples(0.0)
    assert g["power_w"].tolist()[0] == 300.0 and g["lost"].tolist() == [0, 1]


def test_finish_run_first_writer_wins(store):
    run = store.create_run("x", "managed", {})
    assert store.finish_run(run, "failed", "ValueError: boom")
    assert not store.finish_run(run, "stopped")
    r = store.run(run)
    assert r["status"] == "failed" and r["error"] == "ValueError: boom" and r["ended_at"]


def test_control_requests_are_seen_once_and_marked(store):
    run = store.create_run("x", "managed", {})
    a = store.request_control(run, "config", {"num_workers": 2})
    b = store.request_control(run, "stop")
    pending = store.pending_control(run)
    assert [(i, k) for i, k, _ in pending] == [(a, "config"), (b, "stop")]
    assert pending[0][2] == {"num_workers": 2}
    assert store.pending_control(run, after_id=a)[0][0] == b
    store.mark_control(a, "ok")
    assert store.control_result(a)[1] == "ok"
    assert [i for i, _, _ in store.pending_control(run)] == [b]


def test_events_in_order(store):
    run = store.create_run("x", "managed", {})
    store.add_event(run, "config", "start", {"num_workers": 0}, ts=10.0)
    store.add_event(run, "config", "num_workers 0→2", {"num_workers": 2}, ts=12.0)
    ev = store.events(run)
    assert list(ev["label"]) == ["start", "num_workers 0→2"]
    assert len(store.events(run, since=11.0)) == 1


def test_older_file_gains_new_columns(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE gpu_samples (ts REAL, gpu INTEGER, util_pct REAL)")
    conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,"
                 " kind TEXT NOT NULL, config TEXT NOT NULL, accelerator TEXT,"
                 " status TEXT NOT NULL, error TEXT, pid INTEGER, started_at REAL NOT NULL,"
                 " ended_at REAL)")
    conn.commit()
    conn.close()
    s = Store(path)
    s.insert([GpuSample(**{**_blank(1.0, 0), "temp_c": 40.0})])
    assert s.gpu_samples(0.0)["temp_c"].iloc[0] == 40.0
    run = s.create_run("x", "managed", {})
    s.update_run(run, device={"uuid": "GPU-1"})
    assert s.run(run)["device"] == {"uuid": "GPU-1"}


def test_concurrent_writer_process_and_reader(store):
    """Another process writes while this one reads: WAL keeps both working."""
    run = store.create_run("x", "managed", {})
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(store.path.parent.parent)!r})
        from monitor.store import Store
        from monitor.records import StepRecord
        s = Store({str(store.path)!r})
        for k in range(20):
            s.insert([StepRecord({run}, k * 10 + i, 0, k + i * 0.01, 0.0, 0.01, 1, 0)
                      for i in range(10)])
    """)
    import os
    env = {**os.environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent.parent)}
    p = subprocess.Popen([sys.executable, "-c", code], env=env)
    counts = []
    while p.poll() is None:  # reads while the other process writes: never blocked, never torn
        counts.append(len(store.steps(run)))
    assert p.wait() == 0
    assert counts == sorted(counts) and all(c % 10 == 0 for c in counts)
    assert len(store.steps(run)) == 200
    assert store.integrity_ok()


def test_calibration_is_kept_and_ages_out(store):
    assert store.calibration("sample_cost_s:starving") is None
    store.set_calibration("sample_cost_s:starving", 0.0031)
    assert store.calibration("sample_cost_s:starving") == 0.0031
    assert store.calibration("sample_cost_s:starving", max_age_s=-1) is None


def test_gpu_inventory_is_read_from_the_store(store):
    """The page reads the collector's GPU inventory from the store, not the object."""
    from monitor.records import GpuDevice

    assert store.gpu_inventory() == (False, "no GPU telemetry yet", [])
    devs = [GpuDevice(0, "H200", "GPU-a", (0, 0x1A, 0), 143000.0, True),
            GpuDevice(1, "H200", None, None, None)]
    store.set_gpu_inventory(True, "GPU telemetry from NVML: 2 GPUs", devs)
    assert store.gpu_inventory() == (True, "GPU telemetry from NVML: 2 GPUs", devs)
    store.set_gpu_inventory(True, "GPU 1 was lost", devs[:1])
    assert store.gpu_inventory()[1:] == ("GPU 1 was lost", devs[:1])


def test_the_run_before_another_is_the_store_s_to_say(store):
    """The report compares a run with the one stored before it (ui/report.py asks the
    store, no SQL of its own): none before the first, the highest lower id after a gap."""
    ids = [store.create_run(f"r{i}", "preset", {}) for i in range(3)]
    assert store.previous_run(ids[0]) is None
    assert store.previous_run(ids[2]) == ids[1]
    store.db.conn().execute("DELETE FROM runs WHERE id = ?", (ids[1],))
    assert store.previous_run(ids[2]) == ids[0]
    assert store.previous_run(ids[2] + 10) == ids[2]


def _open_when_told(path, go, results) -> None:
    go.wait()
    try:
        Store(path)
        results.put("ok")
    except Exception as exc:  # what the test reports
        results.put(repr(exc))


def test_processes_opening_one_new_store_at_once_all_open_it(tmp_path):
    """`monitor run` creating its store while the page (or a second `monitor run`) opens
    it: SQLite answered the latecomers "database is locked" or "disk I/O error" during the
    other's switch to WAL (a suite's fault test met it), and the one that failed then
    deleted the file the others had just made. Four processes, released at once, 60 times:
    every one opens the store, and the file is there afterwards."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    failed = []
    for i in range(60):
        (tmp_path / f"s{i}").mkdir()
        path = tmp_path / f"s{i}" / "monitor.db"
        go, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_open_when_told, args=(path, go, results))
                 for _ in range(4)]
        for p in procs:
            p.start()
        go.set()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        failed += [g for g in got if g != "ok"]
        assert path.exists(), (i, got)
    assert not failed, failed
