"""A live run's figures where users already look: TensorBoard's event files written by
`monitor run --tensorboard DIR` (monitor/export/tensorboard.py), read back with TensorBoard's
own EventAccumulator; one folder per rank for a real torchrun job; a missing extra is one
line naming its pip install; the monitor's process imports neither torch nor TensorFlow."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.store import Store

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


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
    assert all(8 <= p.value <= 20 for p in ea.Scalars("starvation/compute_ms"))  # a 12 ms step
    verdict = ea.Tensors("starvation/verdict")
    said = verdict[-1].tensor_proto.string_val[0].decode()
    assert said.split(":")[0] in r.stderr and ea.Tensors("starvation/advice")


@pytest.mark.slow
def test_a_torchrun_job_gets_a_folder_per_rank(tmp_path, no_leaks):
    r = run(tmp_path, TORCHRUN, "--standalone", "--nproc-per-node=2",
            str(ROOT / "examples" / "train_ddp.py"), "--epochs", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    steps = Store(tmp_path / "t.db").steps(1)
    for rank in (0, 1):
        own = steps[steps["rank"] == rank]
        share = events(tmp_path / "tb" / "run-1" / f"rank-{rank}").Scalars(
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
