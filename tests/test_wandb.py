"""Weights & Biases (`monitor run --wandb`), offline as the tests must be: the run file W&B's
own client writes is read back record by record with W&B's own record schema
(wandb_internal_pb2.Record; the client has no reader of its own since 0.2x). A single-rank
script's figures are at its training steps; a torchrun job's are each figure's min, max and
worst rank, and each rank's own; the verdict is in the summary and the report a file of the
run; a missing extra is one line."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor.diagnosis import VERDICTS
from monitor.diagnosis.causes import CAUSES
from monitor.store import Store
from tests import jobs
from tests.helpers import wandb_offline

ROOT = Path(__file__).resolve().parent.parent
NAMED = {*VERDICTS, *CAUSES}
BLOCK, HEADER = 32 * 1024, 7  # the run file: LevelDB's log format, after a 7-byte header


def records(path: Path) -> list:
    """Every record of a W&B run file (`run-ID.wandb`), parsed with W&B's own schema."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    out, chunk, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, size, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and size == 0:
            break
        chunk += data[pos + 7:pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):  # FULL, LAST: a record is whole
            r = pb.Record()
            r.ParseFromString(chunk)
            out.append(r)
            chunk = b""
    return out


def wandb_run(tmp_path: Path, *cmd: str) -> tuple[subprocess.CompletedProcess, list]:
    env = wandb_offline(tmp_path)
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--no-live", "--db",
                        str(tmp_path / "w.db"), "--wandb", "sm-test", "--", *cmd], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, (files, r.stderr[-2000:])
    return r, records(files[0])


def history(recs: list) -> list[dict]:
    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in recs if r.WhichOneof("record_type") == "history"]


def summary(recs: list) -> dict:
    out: dict = {}
    for r in recs:
        if r.WhichOneof("record_type") == "summary":
            out.update({u.key or "/".join(u.nested_key): json.loads(u.value_json)
                        for u in r.summary.update})
    return out


@pytest.mark.slow
def test_wandb_offline_holds_the_figures_at_the_training_steps(tmp_path, no_leaks):
    r, recs = wandb_run(tmp_path, sys.executable,
                        str(ROOT / "tests" / "scripts" / "steady_loop.py"), "6")
    steps = Store(tmp_path / "w.db").steps(1)
    points = [h for h in history(recs) if "starvation/data_wait_share" in h]
    span = float(steps["ts"].max() - steps["ts"].min())
    assert len(points) >= int(span), (len(points), span)  # a point a second at least
    at = [h["starvation/step"] for h in points]
    assert at == sorted(at) and set(at) <= set(steps["step"].astype(int)), at
    assert all(0.0 <= h["starvation/data_wait_share"] <= 1.0 for h in points)
    assert {"starvation/samples_per_s", "starvation/wait_ms", "starvation/compute_ms"} <= \
        set(points[-1])
    # plotted against the training's step, not W&B's own
    defined = {r.metric.glob_name or r.metric.name: r.metric.step_metric for r in recs
               if r.WhichOneof("record_type") == "metric"}
    assert defined.get("starvation/*") == "starvation/step", defined
    run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    assert run.project == "sm-test" and "steady_loop.py" in run.display_name, run
    said = summary(recs).get("starvation/verdict", "")
    assert said.split(":")[0] in NAMED, summary(recs)
    report = next((tmp_path / "wandb").glob("offline-run-*/files/starvation-monitor.txt"))
    assert report.read_text().startswith("starvation-monitor run 1: ")


@pytest.mark.slow
@pytest.mark.xdist_group(jobs.GROUP)
def test_a_torchrun_job_is_min_max_the_worst_rank_and_each_ranks_own(two_rank_job):
    """tests/jobs.py's two-rank job, its --wandb output offline."""
    assert two_rank_job.returncode == 0, two_rank_job.err[-2000:]
    files = list(two_rank_job.wandb.glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, (files, two_rank_job.err[-2000:])
    recs = records(files[0])
    many = [h for h in history(recs) if "starvation/data_wait_share/max" in h]
    assert many, history(recs)[:3]
    last = many[-1]
    assert last["starvation/data_wait_share/min"] <= last["starvation/data_wait_share/max"]
    assert last["starvation/data_wait_share/worst_rank"] in (0.0, 1.0)
    assert {"starvation/rank-0/data_wait_share", "starvation/rank-1/data_wait_share"} <= \
        {k for h in many for k in h}


@pytest.mark.slow
def test_a_wandb_server_that_does_not_answer_costs_the_job_nothing(tmp_path, no_leaks):
    """Online, to a server that refuses every connection: W&B's init would wait 90 s and its
    exit hook on its service. The script runs as bare, the run ends `finished` within the
    output's FINAL_S of the script's end, the points not logged are counted in one line and
    a `tracker` event, no traceback, and no W&B service process is left (no_leaks)."""
    from monitor.export.wandb_out import FINAL_S

    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_DIR": str(tmp_path),
           "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_API_KEY": "0" * 40}
    env.pop("WANDB_MODE", None)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--no-live", "--json", "--db",
                        str(tmp_path / "w.db"), "--wandb", "--", sys.executable,
                        str(ROOT / "tests" / "scripts" / "steady_loop.py"), "3"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    store = Store(tmp_path / "w.db")
    assert store.run(1)["status"] == "finished"
    said = [x for x in r.stderr.splitlines() if x.startswith("starvation-monitor: wandb:")]
    assert len(said) == 1 and "points could not be logged" in said[0], r.stderr[-2000:]
    assert store.events(1, kinds=("tracker",))["label"].tolist() == [said[0].split(": ", 1)[1]]
    # the end waited FINAL_S for W&B, not its init's 90 s nor its exit hook's wait on its
    # service (96 s in all before; 20 s here quiet: a 3 s script, its start, FINAL_S)
    assert json.loads(r.stdout.strip().splitlines()[-1])["status"] == "finished"
    assert took < 60 + FINAL_S, took


def test_a_missing_wandb_is_one_line_naming_its_install(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "wandb.py").write_text("raise ImportError('not installed')\n")
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / "m.db"),
                        "--wandb", "--", sys.executable, "-c", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "error: --wandb needs W&B's client: pip install 'starvation-monitor[wandb]'")
