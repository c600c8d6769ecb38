"""A live run's figures where users already look: TensorBoard's event files written by
`monitor run --tensorboard DIR` (monitor/export/tensorboard.py), read back with TensorBoard's
own EventAccumulator; one folder per rank for a real torchrun job; a missing extra is one
line naming its pip install; the monitor's process imports neither torch nor TensorFlow.
MLflow: a real `mlflow server` (SQLite, 127.0.0.1) holds the metrics with their steps and
the verdict tag, read back with MLflow's own client; the script's own run is used; a server
killed mid-run loses the job nothing."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from monitor.diagnosis import VERDICTS
from monitor.diagnosis.causes import CAUSES
from monitor.records import TRACKER
from monitor.store import Store
from tests import jobs
from tests.conftest import wait_for
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
NAMED = {*VERDICTS, *CAUSES}  # what a verdict says: a family, or the cause found


def events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def run(tmp_path: Path, *cmd: str, out: str = "tb") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monitor", "run", "--no-live", "--db",
                           str(tmp_path / "t.db"), "--tensorboard", str(tmp_path / out), "--",
                           *cmd], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_tensorboard_reads_a_data_wait_point_a_second_and_the_verdict(tmp_path, no_leaks):
    r = run(tmp_path, sys.executable, str(ROOT / "tests" / "scripts" / "steady_loop.py"), "6")
    assert r.returncode == 0, r.stderr[-2000:]
    steps = Store(tmp_path / "t.db").steps(1)
    ea = events(tmp_path / "tb" / "run-1")
    share = ea.Scalars("starvation/data_wait_share")
    span = float(steps["ts"].max() - steps["ts"].min())
    # a point per window of at most the follow's tick: at least one per second of training
    assert len(share) >= int(span), (len(share), span)
    assert all(0.0 <= p.value <= 1.0 for p in share)
    # at the training's own steps, in order, within the steps the store holds
    assert [p.step for p in share] == sorted(p.step for p in share)
    assert set(p.step for p in share) <= set(steps["step"].astype(int))
    # the figures beside it, and the loop's rate as the store's steps give it
    tags = set(ea.Tags()["scalars"])
    assert {"starvation/samples_per_s", "starvation/wait_ms", "starvation/compute_ms",
            "starvation/device_busy"} <= tags
    # each point a window's mean of the steps' compute (a 12 ms sleep: longer on a saturated
    # box, as the store measured it too)
    ms = steps["compute_s"] * 1000.0
    assert all(ms.min() - 1e-6 <= p.value <= ms.max() + 1e-6
               for p in ea.Scalars("starvation/compute_ms"))
    assert ms.min() >= 11.5, ms.describe()  # a 12 ms sleep a step
    verdict = ea.Tensors("starvation/verdict")
    said = verdict[-1].tensor_proto.string_val[0].decode()
    # the live window's verdict (the end-of-run summary may name the run's own cause)
    assert said.split(":")[0] in NAMED and ea.Tensors("starvation/advice"), said


@pytest.mark.slow
@pytest.mark.xdist_group(jobs.GROUP)
def test_a_torchrun_job_gets_a_folder_per_rank(two_rank_job):
    """tests/jobs.py's two-rank job, its --tensorboard output."""
    assert two_rank_job.returncode == 0, two_rank_job.err[-2000:]
    steps = Store(two_rank_job.db).steps(1)
    for rank in (0, 1):
        own = steps[steps["rank"] == rank]
        share = events(two_rank_job.tensorboard / "run-1" / f"rank-{rank}").Scalars(
            "starvation/data_wait_share")
        assert share and {p.step for p in share} <= set(own["step"].astype(int)), rank


def test_a_missing_extra_is_one_line_naming_its_install(tmp_path):
    """Without TensorBoard's writer (hidden here as an uninstalled package is), the run is
    refused before it exists, in one line."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "tensorboard.py").write_text("raise ImportError('not installed')\n")
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / "m.db"),
                        "--tensorboard", str(tmp_path / "tb"), "--", sys.executable, "-c", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**ENV, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "error: --tensorboard needs TensorBoard's event writer: "
        "pip install 'starvation-monitor[tensorboard]'")
    assert not (tmp_path / "m.db").exists() or Store(tmp_path / "m.db").runs().empty


def test_the_writer_imports_neither_torch_nor_tensorflow():
    code = ("import sys; from monitor.export import tensorboard as t; t._writer_parts(); "
            "print(sorted(m for m in ('torch', 'tensorflow') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


MLFLOW_VENV = ROOT / ".venv-mlflow"  # a real tracking server, in a venv of its own (Makefile)


@contextlib.contextmanager
def mlflow_server(tmp_path: Path, proxied: bool = False):
    """`mlflow server` on 127.0.0.1 with a SQLite backend, started for the test; yields its
    URI and the process (a test may stop it). Its artifact root is a folder, or with
    `proxied` its artifact proxy (`mlflow-artifacts:` URIs, as a remote server has)."""
    exe = MLFLOW_VENV / "bin" / "mlflow"
    if not exe.exists():
        why = "no MLflow server here: `make .venv-mlflow/.ready` makes it (make test does)"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    port = free_port()
    p = subprocess.Popen([str(exe), "server", "--host", "127.0.0.1", "--port", str(port),
                          "--workers", "1", "--backend-store-uri",
                          f"sqlite:///{tmp_path / 'mlflow.db'}",
                          *(["--artifacts-destination", str(tmp_path / "proxied")] if proxied
                            else ["--default-artifact-root", str(tmp_path / "artifacts")])],
                         cwd=tmp_path,
                         # (its job runner, for GenAI evaluations, is a process more and a
                         # folder in /dev/shm that a killed server leaves: not needed here)
                         env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    uri = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    try:
        assert wait_for(up, timeout=180, every=0.5), "the MLflow server did not start"
        yield uri, p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


def mlflow_read(uri: str, code: str) -> dict:
    """What MLflow's own client reads back (run in the server's venv: `client` is an
    MlflowClient of `uri`), as the JSON the code prints."""
    r = subprocess.run([str(MLFLOW_VENV / "bin" / "python"), "-c",
                        "import json, sys\nfrom mlflow.tracking import MlflowClient\n"
                        f"client = MlflowClient({uri!r})\n" + code],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


READ_RUN = """
runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
out = {}
for run in runs:
    hist = client.get_metric_history(run.info.run_id, "starvation/data_wait_share")
    out[run.info.run_id] = {"name": run.info.run_name, "status": run.info.status,
                            "tags": run.data.tags, "steps": [m.step for m in hist],
                            "artifact_uri": run.info.artifact_uri,
                            "report": open(client.download_artifacts(
                                run.info.run_id, "starvation-monitor.txt")).read()
                            if any(f.path == "starvation-monitor.txt"
                                   for f in client.list_artifacts(run.info.run_id)) else None,
                            "values": [m.value for m in hist],
                            "keys": sorted(run.data.metrics)}
print(json.dumps(out))
"""


def steady_into(uri: str, tmp_path: Path, seconds: int) -> subprocess.CompletedProcess:
    """`monitor run --mlflow URI` over the steady loop for `seconds`, which ends well."""
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--no-live", "--db",
                        str(tmp_path / "t.db"), "--mlflow", uri, "--", sys.executable,
                        str(ROOT / "tests" / "scripts" / "steady_loop.py"), str(seconds)],
                       cwd=ROOT, env={**ENV, "MLFLOW_TRACKING_URI": ""},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.mark.slow
def test_mlflow_holds_the_metrics_with_their_steps_and_the_verdict(tmp_path, no_leaks):
    with mlflow_server(tmp_path) as (uri, _):
        r = steady_into(uri, tmp_path, 6)
        runs = mlflow_read(uri, READ_RUN)
    (run,) = runs.values()  # the script opened none: a run of its own, named after it
    assert run["name"].startswith("steady_loop.py") and run["status"] == "FINISHED"
    steps = Store(tmp_path / "t.db").steps(1)
    span = float(steps["ts"].max() - steps["ts"].min())
    assert len(run["steps"]) >= int(span) and set(run["steps"]) <= set(steps["step"])
    assert all(0.0 <= v <= 1.0 for v in run["values"])
    assert {"starvation/samples_per_s", "starvation/wait_ms"} <= set(run["keys"])
    assert run["tags"]["starvation.verdict"].split(":")[0] in NAMED, run["tags"]
    assert "could not be sent" not in r.stderr
    # the last verdict and its advice in full, as the run's artifact (a local server's folder)
    named = run["tags"]["starvation.verdict"].split(":")[0]
    assert run["report"] and run["report"].startswith(f"starvation-monitor run 1: {named}\n")


@pytest.mark.slow
def test_mlflow_report_goes_through_a_servers_artifact_proxy(tmp_path, no_leaks):
    """A server that proxies its artifacts (`mlflow-artifacts:` URIs, as a remote one has):
    the report is PUT through it, and MLflow's client reads it back."""
    with mlflow_server(tmp_path, proxied=True) as (uri, _):
        r = steady_into(uri, tmp_path, 4)
        (run,) = mlflow_read(uri, READ_RUN).values()
    assert run["artifact_uri"].startswith("mlflow-artifacts:"), run["artifact_uri"]
    assert run["report"] and run["report"].startswith("starvation-monitor run 1: "), run
    assert (tmp_path / "proxied").is_dir() and "mlflow:" not in r.stderr, r.stderr[-800:]


@pytest.mark.slow
def test_mlflow_logs_into_the_scripts_own_run_and_a_server_gone_loses_nothing_else(
        tmp_path, no_leaks):
    """MLFLOW_RUN_ID (the script's run) is where the figures go; the server stopped mid-run:
    the job runs to its end, the run is `finished`, and what was dropped is said and
    stored."""
    with mlflow_server(tmp_path) as (uri, server):
        made = mlflow_read(uri, "exp = client.create_experiment('training')\n"
                                "run = client.create_run(exp, run_name='my training')\n"
                                "print(json.dumps({'id': run.info.run_id}))")
        p = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--no-live", "--db",
                              str(tmp_path / "t.db"), "--mlflow", uri, "--", sys.executable,
                              str(ROOT / "tests" / "scripts" / "steady_loop.py"), "14"],
                             cwd=ROOT, env={**ENV, "MLFLOW_RUN_ID": made["id"]},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            store = Store(tmp_path / "t.db") if wait_for((tmp_path / "t.db").exists, 60) \
                else None

            def sent() -> bool:  # (MLflow's REST API: its client takes seconds to import)
                url = f"{uri}/api/2.0/mlflow/runs/get?run_id={made['id']}"
                try:
                    with urllib.request.urlopen(url, timeout=10) as r:
                        return bool(json.loads(r.read())["run"]["data"].get("metrics"))
                except OSError:
                    return False
            assert wait_for(lambda: len(store.steps(1)) > 20, timeout=120)
            # a saturated box's server answered in seconds; the output sends once a second
            assert wait_for(sent, timeout=120, every=1.0), "nothing reached the script's run"
            os.killpg(server.pid, signal.SIGKILL)  # the tracker is gone mid-run
            server.wait(30)
            out, err = p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert p.returncode == 0, err[-2000:]
    assert store.run(1)["status"] == "finished"
    assert "mlflow: " in err and "points could not be sent" in err
    note = store.events(1, kinds=(TRACKER,))
    assert len(note) == 1 and json.loads(note["data"].iloc[0])["dropped"] > 0


def test_many_ranks_in_a_flat_tracker_are_min_max_and_the_worst_rank():
    from monitor.assess.follow import flat_figures

    one = {"data_wait_share": 0.2, "wait_ms": 3.0}
    assert flat_figures({0: one}) == one
    many = flat_figures({0: one, 1: {"data_wait_share": 0.6, "wait_ms": 9.0},
                         2: {"data_wait_share": 0.1, "wait_ms": 1.0}})
    assert many["data_wait_share/min"] == 0.1 and many["data_wait_share/max"] == 0.6
    assert many["wait_ms/max"] == 9.0 and many["data_wait_share/worst_rank"] == 1.0


@pytest.mark.parametrize(("given", "said"), [
    ("file:./mlruns", "give the tracking server's http:// or https:// address"),
    ("", "--mlflow needs a tracking server: --mlflow http://HOST:PORT"),
])
def test_an_unusable_tracking_uri_is_refused_in_one_line(tmp_path, given, said):
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / "m.db"),
                        "--mlflow", *([given] if given else []), "--", sys.executable, "-c",
                        "0"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**ENV, "MLFLOW_TRACKING_URI": ""})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert said in r.stderr.strip().splitlines()[-1]
