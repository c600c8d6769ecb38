"""The frameworks people train with, run for real on the CPU under `monitor run` with
unmodified scripts: PyTorch Lightning (sanity check and a val loader; its own DDP launcher
with devices=2), the Hugging Face Trainer (accelerate's loader built with batch_sampler=),
a loader iterated by a background thread, and a training venv without our dependencies."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.probe.phases import DISCOVER_STEPS
from monitor.store import Store
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
pytestmark = pytest.mark.slow


def start(db: Path, python: str, script: str, *args: str, flags: tuple = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--json", *flags, "--",
         python, str(SCRIPTS / script), *args], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def finish(p: subprocess.Popen, timeout: float = 240) -> tuple[str, str, dict]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return out, err, json.loads(out.strip().splitlines()[-1])


def probe_events(store: Store, run_id: int) -> list[str]:
    ev = store.events(run_id, kinds=("probe",))
    return ev["label"].tolist()


def test_lightning_times_the_training_loader_and_every_step(tmp_path, no_leaks):
    """Defaults (sanity check on, a val loader of batch 64): 3 epochs x 12 batches of 32 are
    stored, the last of each epoch included; none of the validation loader's."""
    db = tmp_path / "l.db"
    out, err, d = finish(start(db, sys.executable, "lightning_fit.py", "--epochs", "3",
                               "--samples", "384", "--work", "5"))
    store = Store(db)
    steps = store.steps(d["run_id"])
    assert len(steps) == 3 * 12, (steps.groupby("epoch").size().to_dict(), err[-2000:])
    assert set(steps["samples"]) == {32} and sorted(steps["epoch"].unique()) == [0, 1, 2]
    assert d["config"]["batch_size"] == 32
    labels = probe_events(store, d["run_id"])
    assert any("timing the training loader (Lightning's fit loop)" in x for x in labels)
    # the step's phases, through torch's own hooks inside Lightning's closure, on the steps
    # timed (one in each SAMPLE_S or so: NOTE [phase sampling])
    timed = steps[steps["forward_s"].notna()]
    assert len(timed) >= DISCOVER_STEPS, steps["forward_s"].tolist()
    assert timed[["backward_s", "optimizer_s"]].notna().all().all(), timed
    assert d["phases"]["forward"] > 0
    assert any(x.startswith("not timed:") and "batch 64" in x and "evaluation loop" in x
               for x in labels), labels


def test_lightning_reloading_its_loader_each_epoch_keeps_a_change_made_live(tmp_path,
                                                                           no_leaks):
    """NOTE [a loader built each epoch]: under reload_dataloaders_every_n_epochs=1 Lightning
    builds a new training DataLoader each epoch from the module's hook; a num_workers change
    requested after epoch 0 reaches epoch 1's loader and, where the new loader of epoch 2
    would undo it, that one too; every epoch's steps are stored."""
    db, go = tmp_path / "r.db", tmp_path / "go"
    p = start(db, sys.executable, "lightning_fit.py", "--epochs", "3", "--samples", "192",
              "--work", "5", "--no-val", "--reload", "--hold-after-epoch0", str(go))
    store = Store(db) if wait_for(db.exists, timeout=120) else None
    assert wait_for(lambda: len(store.steps(1)) >= 3, timeout=120), p.stderr
    cid = store.request_control(1, "config", {"num_workers": 2})
    go.touch()
    out, err, d = finish(p)
    workers = dict(re.findall(r"rank 0 epoch (\d): 192 samples, [\d.]+ samples/s, "
                              r"num_workers=(\d)", out))
    assert workers == {"0": "0", "1": "2", "2": "2"}, (out, err[-2000:])
    applied, result = store.control_result(cid)
    assert applied and result == "ok: applied at epoch 1", result
    steps = store.steps(d["run_id"])
    assert steps.groupby("epoch").size().to_dict() == {0: 6, 1: 6, 2: 6}, err[-2000:]
    assert set(steps[steps["epoch"] > 0]["config_seq"]) == {1}
    assert any(x.startswith("the training loader is built again (Lightning's fit loop")
               for x in probe_events(store, d["run_id"])), probe_events(store, d["run_id"])


def test_lightning_ddp_launcher_records_each_rank_and_requests_reach_one(tmp_path, no_leaks):
    """strategy="ddp", devices=2, no torchrun: Lightning's launcher sets LOCAL_RANK and
    NODE_RANK, not RANK. Two ranks, each its own 4 epochs x 6 steps; a request for rank 1
    changes rank 1's loader only."""
    db = tmp_path / "ddp.db"
    go = tmp_path / "go"
    p = start(db, sys.executable, "lightning_fit.py", "--epochs", "4", "--samples", "384",
              "--devices", "2", "--work", "5", "--no-val", "--hold-after-epoch0", str(go))
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    assert wait_for(lambda: len(store.ranks(1)) == 2, timeout=120), p.stderr
    cid = store.request_control(1, "config", {"num_workers": 1, "rank": 1})
    go.touch()  # the ranks wait after epoch 0: the request is there before epoch 1 starts
    out, err, d = finish(p)
    steps = store.steps(d["run_id"])
    per_rank = steps.groupby("rank").size().to_dict()
    assert per_rank == {0: 24, 1: 24}, (per_rank, err[-2000:])
    assert not steps.duplicated(["rank", "step"]).any()
    ranks = store.ranks(d["run_id"])
    assert sorted(ranks["rank"]) == [0, 1] and set(ranks["world_size"]) == {2}
    cfg = {int(r): c for r, c in zip(ranks["rank"], ranks["config"], strict=True)}
    assert cfg[1]["num_workers"] == 1 and cfg[0]["num_workers"] == 0, cfg
    assert (store.control_result(cid)[1] or "").startswith("ok: applied"), cfg
    assert d["world_size"] == 2


def test_hf_trainer_batch_size_and_a_retune_reach_the_base_loader(tmp_path, no_leaks):
    """accelerate builds the Trainer's loader with batch_sampler= (batch_size None): the run
    records batch 16; a request for 2 workers starts 2 worker processes in the loader that
    iterates (their PIDs in the next epoch's event); the eval loader is not timed."""
    db = tmp_path / "hf.db"
    # (epochs of 0.1-0.2 s; the probe's writer stores steps every 0.5 s: the request, sent
    # once the first are stored, lands a few epochs on; twelve epochs leave it room on a
    # quiet box, where six were over before the first steps were stored)
    p = start(db, sys.executable, "hf_trainer.py", "--epochs", "12", "--samples", "160",
              "--work", "20")
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    assert wait_for(lambda: len(store.steps(1)) >= 2, timeout=120), p.stderr
    cid = store.request_control(1, "config", {"num_workers": 2})
    out, err, d = finish(p)
    steps = store.steps(d["run_id"])
    assert d["config"]["batch_size"] == 16 and set(steps["samples"]) == {16}
    assert len(steps) == 12 * 10, steps.groupby("epoch").size().to_dict()
    # the Trainer's phases: accelerate's backward and its wrapped optimizer reach the hooks
    # (its loader fetches a batch ahead: the first timed step ends before the first forward)
    timed = steps.iloc[1:][steps["forward_s"].iloc[1:].notna()]  # (NOTE [phase sampling])
    assert len(timed) >= DISCOVER_STEPS, steps["forward_s"].tolist()
    assert timed[["backward_s", "optimizer_s"]].notna().all().all(), timed
    assert (store.control_result(cid)[1] or "").startswith("ok: applied at epoch")
    epochs = store.events(d["run_id"], kinds=("epoch",))
    pids = [json.loads(x)["worker_pids"] for x in epochs["data"]]
    assert pids and len(pids[-1]) == 2, pids  # the loader that iterates has 2 workers now
    labels = probe_events(store, d["run_id"])
    assert any("Hugging Face Trainer's training loop" in x for x in labels), labels
    assert any(x.startswith("not timed:") and "evaluat" in x for x in labels), labels


def test_a_loader_iterated_by_a_background_thread_is_not_data_wait(tmp_path, no_leaks):
    """A prefetch thread drains the DataLoader into a queue (MONAI ThreadDataLoader style):
    its next() blocks that thread, not the loop; only the queue the loop reads is timed,
    through watch()."""
    db = tmp_path / "t.db"
    out, err, d = finish(start(db, sys.executable, "thread_loader.py"))
    store = Store(db)
    labels = probe_events(store, d["run_id"])
    assert any("not timed" in x and "thread 'prefetch'" in x for x in labels), labels
    steps = store.steps(d["run_id"])
    assert len(steps) == 2 * 12
    # the thread keeps the queue full: the loop's own wait is small; the loader's sleep is
    # 8 x 8 ms = 64 ms per batch, on the prefetch thread
    assert steps["wait_s"].iloc[2:].median() < 0.032, steps["wait_s"].describe()


def test_fastai_fit_stores_every_training_step_with_its_loaders_settings(tmp_path,
                                                                         no_leaks):
    """fastai's DataLoader is no torch DataLoader (once: 0 of 40 steps; with a hand-made
    watch(), num_workers 1 and a phantom worker): timed at its own __iter__, its settings
    its _FakeLoader's, Learner._do_epoch_train's loader the training one, validation not;
    and the same with `monitor.fastai_callback()` and no `monitor run`."""
    db = tmp_path / "f.db"
    p = start(db, sys.executable, "fastai_fit.py", "2")
    out, err, d = finish(p)
    store = Store(db)
    steps = store.steps(d["run_id"])
    assert steps.groupby("epoch").size().to_dict() == {0: 12, 1: 12}, err[-2000:]
    assert set(steps["samples"]) == {8}
    c = d["config"]
    assert (c["loader_kind"], c["num_workers"], c["batch_size"]) == ("fastai", 2, 8), c
    labels = probe_events(store, d["run_id"])
    assert any(x.startswith("timing the training loader (fastai's Learner.fit)") for x in
               labels), labels
    assert any(x.startswith("not timed:") and "_do_epoch_validate" in x for x in labels)
    assert d["retune"]["possible"] is True and d["evaluation_passes"] == 0
    # the notebook's way: the callback, no `monitor run`, the same steps in the store
    cb = tmp_path / "cb.db"
    r = subprocess.run([sys.executable, str(SCRIPTS / "fastai_fit.py"), "2", "--callback"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": str(ROOT),
                            "STARVATION_MONITOR_DB": str(cb)})
    assert r.returncode == 0, r.stderr[-2000:]
    runs = Store(cb).runs()
    assert len(runs) == 1
    got = Store(cb).steps(int(runs["id"].iloc[0]))
    assert got.groupby("epoch").size().to_dict() == {0: 12, 1: 12}, r.stderr[-2000:]
    assert Store(cb).run(int(runs["id"].iloc[0]))["status"] == "finished"


def test_pyg_evaluation_on_the_training_loader_is_no_training_and_graphs_are_samples(
        tmp_path, no_leaks):
    """PyG's mutag_gin.py calls `test(train_loader)` after each `train()` (once: 600 steps
    stored for 300, "epochs": 40 for 20): only the training passes are steps and epochs, the
    evaluation passes counted apart; a batch's samples are its graphs (num_graphs), not its
    nodes."""
    db = tmp_path / "g.db"
    out, err, d = finish(start(db, sys.executable, "pyg_mutag.py", "4"))
    assert out.count("epoch ") == 4, out
    steps = Store(db).steps(d["run_id"])
    assert len(steps) == 4 * 15 and d["epochs"] == 4, (len(steps), d["epochs"])
    assert d["evaluation_passes"] == 4, d
    assert set(steps["samples"]) == {10}, set(steps["samples"])
    said = {json.loads(x).get("samples_from") for x in
            Store(db).events(d["run_id"], kinds=("loader",))["data"]}
    assert said == {"DataBatch.num_graphs"}, said


@pytest.mark.timeout(600)  # Ray starts its own cluster: 150 s here quiet, more when busy
def test_ray_train_stores_every_step_of_both_ranks_with_host_evidence(tmp_path, no_leaks):
    """Ray Train's TorchTrainer, 2 workers, unmodified under `monitor run` (once: 0 of 64
    steps, "iterated by thread 'TrainingThread(...)'"): every step each rank reports, of
    ranks 0 and 1, the run named after the driver's script, the rank processes (Ray's, not
    this driver's children) sampled, and the loader re-tunable (Ray's wrapper builds its
    iterator from the DataLoader it wraps at every epoch). Ray on a saturated 2-core box can
    fail by its own timeouts ("GetTimeoutError", seen beside a busy suite): the steps it ran
    are still the steps stored, and the run says it failed."""
    db = tmp_path / "ray.db"
    p = subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--json", "--",
         sys.executable, str(SCRIPTS / "ray_train.py")], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
             "RAY_num_prestart_python_workers": "0", "RAY_DEDUP_LOGS": "0"})
    try:
        out, err = p.communicate(timeout=540)
    finally:
        if p.poll() is None:  # the whole tree: monitor run, the driver, Ray's processes
            os.killpg(p.pid, 9)
            p.communicate()
    said = {(int(r), int(e)): int(n) for r, e, n in
            re.findall(r"rank (\d) epoch (\d): (\d+) batches", out + err)}
    store = Store(db)
    d = json.loads(out.strip().splitlines()[-1])
    steps = store.steps(d["run_id"])
    per = steps.groupby(["rank", "epoch"]).size().to_dict() if not steps.empty else {}
    if p.returncode != 0:  # Ray's own failure under load: what ran is what is stored
        print(f"Ray failed (rc {p.returncode}); its ranks reported {said}")
        assert all(per.get(k) == n for k, n in said.items()), (per, said)
        assert store.run(d["run_id"])["status"] == "failed"
        return
    assert said == {(r, e): 32 for r in (0, 1) for e in (0, 1, 2)}, out[-2000:]
    assert per == said, (per, err[-3000:])
    assert set(steps["samples"]) == {8}
    ranks = store.ranks(d["run_id"])
    assert sorted(ranks["rank"].astype(int)) == [0, 1] and d["world_size"] == 2
    assert d["config"]["workload"] == "attached:ray_train.py", d["config"]
    assert d["config"]["num_workers"] == 1
    assert d["retune"] == {"possible": True, "why": None}, d["retune"]
    # the rank processes sampled while they stepped: their own host rows
    start_ts, end_ts = float(steps["ts"].min()), float(steps["ts"].max())
    host = store.host_samples(start_ts, end_ts)
    rows = host[host["rank"].notna() & host["proc_cpu_pct"].notna()]
    assert set(rows["rank"].astype(int)) == {0, 1}, host[["ts", "rank", "proc_cpu_pct"]]
    assert (rows["proc_runq_pct"].dropna() >= 0).all(), rows["proc_runq_pct"].tolist()
    assert d["verdict_family"] != "no data", d["verdict_text"]
    assert "no /proc schedstat here" not in d["verdict_text"], d["verdict_text"]


def test_a_training_loop_in_a_thread_of_its_own_is_timed(tmp_path, no_leaks):
    """Ray Train runs the train function in its `TrainingThread`, the main thread iterating
    no loader: that thread's loop is the training loop (once refused as "not the training
    loop's": 0 of 64 steps). Every step stored, its phases found; validation not timed."""
    db = tmp_path / "r.db"
    out, err, d = finish(start(db, sys.executable, "thread_loop.py"))
    assert out.count(": 12 batches") == 2, out
    store = Store(db)
    steps = store.steps(d["run_id"])
    assert steps.groupby("epoch").size().to_dict() == {0: 12, 1: 12}, err[-2000:]
    assert set(steps["samples"]) == {8} and d["config"]["num_workers"] == 1
    assert steps["backward_s"].notna().any(), steps["backward_s"].tolist()
    labels = probe_events(store, d["run_id"])
    assert not any("not the training loop's" in x for x in labels), labels


def torch_only_python(tmp_path: Path) -> str:
    """A real venv's interpreter that sees torch (and what torch itself needs), linked from
    this interpreter's site-packages, and nothing of ours: no pandas, numpy, psutil,
    streamlit, plotly or pynvml."""
    import torch

    venv = tmp_path / "train-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    ours = Path(torch.__file__).resolve().parent.parent
    links = tmp_path / "torch-only"
    links.mkdir()
    for name in ("torch", "torchgen", "functorch", "typing_extensions.py", "sympy", "mpmath",
                 "networkx", "jinja2", "markupsafe", "fsspec", "filelock"):
        if (ours / name).exists():
            (links / name).symlink_to(ours / name)
    for meta in ours.glob("torch-*.dist-info"):
        (links / meta.name).symlink_to(meta)
    (site / "torch_only.pth").write_text(f"{links}\n")
    return str(venv / "bin" / "python")


def test_attached_script_in_a_venv_without_our_requirements(tmp_path, no_leaks):
    python = torch_only_python(tmp_path)
    r = subprocess.run([python, "-c", "import torch\ntry:\n import pandas\nexcept ImportError:"
                        "\n print('no pandas')"], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "no pandas", r.stderr
    db = tmp_path / "v.db"
    out, err, d = finish(start(db, python, "two_epochs.py"))
    assert "probe not installed" not in err and "probe disabled" not in err, err
    assert len(Store(db).steps(d["run_id"])) == 24 and d["verdict"] != "no data"
