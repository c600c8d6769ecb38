"""Scripts on PyPI's torchvision and Ultralytics, under `monitor run`, in a venv of their own
(the Makefile's .venv-vision: PyPI's torch with its torchvision, whose import fails beside the
CPU torch of .venv): transforms called inside next(loader) are the loader's work, not the
forward pass; `yolo train` counts images, not boxes, and numbers its epochs from 0 though it
calls iter() twice an epoch; its InfiniteDataLoader's workers are credited with their
batches."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.store import Store

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
VISION = ROOT / ".venv-vision" / "bin"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def vision_python() -> str:
    if not (VISION / ".." / ".ready").exists():
        why = "no torchvision venv here: `make .venv-vision/.ready` makes it (make test does)"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    return str(VISION / "python")


def monitored(tmp_path: Path, *command: str) -> tuple[str, dict]:
    """`monitor run --json -- command` in tmp_path, offline, Ultralytics' settings there."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "YOLO_OFFLINE": "1",
           "YOLO_CONFIG_DIR": str(tmp_path / "ultralytics")}
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / "v.db"),
                        "--json", "--", *command], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr, json.loads(r.stdout.strip().splitlines()[-1])


def test_torchvision_transforms_at_j0_are_the_loaders_work(tmp_path, no_leaks):
    """-j 0: RandomResizedCrop and the rest run on the training thread inside next(loader).
    No transform is a forward root (the forward is the model and the loss), every training
    step is stored (3 epochs x 6 batches of 8), the validation loader's are not."""
    err, d = monitored(tmp_path, vision_python(), str(SCRIPTS / "vision_train.py"),
                       str(tmp_path / "images"), "-j", "0", "--epochs", "3")
    store = Store(tmp_path / "v.db")
    steps = store.steps(d["run_id"])
    assert len(steps) == 3 * 6 and set(steps["samples"]) == {8}, steps.groupby("epoch").size()
    assert sorted(steps["epoch"].unique()) == [0, 1, 2] and d["epochs"] == 3
    assert d["config"]["num_workers"] == 0 and d["config"]["batch_size"] == 8
    notes = [x for x in store.events(d["run_id"], kinds=("probe",))["label"]
             if x.startswith("step phases:")]
    roots = notes[0].split("the forward pass timed at ", 1)[1].split(" (the outermost")[0]
    assert roots.split(", ") == ["MobileNetV3", "CrossEntropyLoss"], notes
    assert "RandomResizedCrop" in notes[0] and "inside next(loader)" in notes[0], notes
    assert d["phases"]["forward"] > 0 and d["phases"]["data_wait"] > 0, d["phases"]


def test_yolo_train_counts_images_not_boxes_and_epochs_from_zero(tmp_path, no_leaks):
    """`yolo train` (0 workers on a CPU): 32 images of 1-3 boxes each, batch 8, 4 epochs:
    16 steps of 8 samples (its collate's first value, batch_idx, has one entry a box),
    epochs 0-3 though the trainer calls iter() twice an epoch (`enumerate(loader)`, then
    again inside its progress bar)."""
    py = vision_python()
    data = subprocess.run([py, str(SCRIPTS / "yolo_train.py"), str(tmp_path / "yolo"),
                           "--dataset-only"], capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip()
    err, d = monitored(tmp_path, str(VISION / "yolo"), "train", "model=yolov8n.yaml",
                       f"data={data}", "epochs=4", "imgsz=64", "batch=8", "device=cpu",
                       "plots=False", f"project={tmp_path / 'runs'}", "name=t", "exist_ok=True")
    store = Store(tmp_path / "v.db")
    steps = store.steps(d["run_id"])
    assert len(steps) == 16 and set(steps["samples"]) == {8}, (steps["samples"].tolist(), err)
    assert sorted(steps["epoch"].unique()) == [0, 1, 2, 3] and d["epochs"] == 4, d["epochs"]
    loader = [json.loads(x) for x in store.events(d["run_id"], kinds=("loader",))["data"]]
    assert [e["epoch"] for e in loader] == [0, 1, 2, 3], loader
    assert "InfiniteDataLoader" in err and d["config"]["batch_size"] == 8


def test_yolo_infinite_loader_workers_are_credited_with_their_batches(tmp_path, no_leaks):
    """Ultralytics' trainer with 2 workers: its InfiniteDataLoader keeps one iterator for
    every epoch (built lazily at its first batch); each worker's batches are counted from
    that iterator, and the 2 workers deliver every batch after the first epoch's first."""
    err, d = monitored(tmp_path, vision_python(), str(SCRIPTS / "yolo_train.py"),
                       str(tmp_path / "yolo"), "--workers", "2", "--epochs", "3")
    steps = Store(tmp_path / "v.db").steps(d["run_id"])
    assert len(steps) == 12 and sorted(steps["epoch"].unique()) == [0, 1, 2], len(steps)
    assert d["config"]["num_workers"] == 2
    per_worker = steps.groupby("worker").size().to_dict()
    assert set(per_worker) == {0, 1} and sum(per_worker.values()) >= 11, per_worker
    assert {w["worker"]: w["batches"] for w in d["workers"]} and all(
        w["batches"] > 0 for w in d["workers"]), d["workers"]
