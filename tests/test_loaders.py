"""The loaders real training scripts use, timed right under `monitor run` with unmodified
scripts (tests/scripts/loaders.py) and real worker processes: every training step stored
once with its batch size, the script's output as bare, and a loader that cannot be re-tuned
live says so and why (in the run's JSON and in the answer to a request)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.store import Store
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "loaders.py"
pytestmark = pytest.mark.slow
EPOCHS = 3


def start(db: Path, kind: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--json", "--",
         sys.executable, str(SCRIPT), kind, *args], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def finish(p: subprocess.Popen) -> tuple[list[str], str, dict]:
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    lines = out.strip().splitlines()
    return [ln for ln in lines if ln.startswith("epoch ")], err, json.loads(lines[-1])


# kind: batches an epoch
KINDS = {"multi_epochs": 6, "multi_epochs_lazy": 6, "inner_iter": 6, "stateful": 6,
         "webloader": 6, "hf_map": 6, "hf_stream": 6, "combined": 6, "boxes": 6, "graphs": 6,
         "eval_pass": 6, "train_in_step": 6}
SAMPLES_FROM = {"boxes": "the leading dimension of batch['img']",
                "graphs": "GraphBatch.num_graphs"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_training_step_is_stored_once_with_its_batch_size(kind, tmp_path, no_leaks):
    db = tmp_path / "l.db"
    lines, err, d = finish(start(db, kind, "--workers", "2", "--epochs", str(EPOCHS)))
    assert len(lines) == EPOCHS and all(f"{KINDS[kind]} batches" in x for x in lines), lines
    if kind != "combined":  # the loop got every sample, as bare (48 a epoch, sum 1128)
        assert all("48 samples, checksum 1128" in x for x in lines), lines
    assert "Traceback" not in err and "timing stopped" not in err, err[-2000:]
    steps = Store(db).steps(d["run_id"])
    per_epoch = steps.groupby("epoch").size().to_dict()
    assert per_epoch == {e: KINDS[kind] for e in range(EPOCHS)}, (per_epoch, err[-2000:])
    assert not steps.duplicated(["step"]).any()
    assert set(steps["samples"]) == {8} and d["config"]["batch_size"] == 8, d["config"]
    assert d["config"]["num_workers"] == 2
    assert d["epochs"] == EPOCHS
    # how the samples were counted, said once a loader report (images, not boxes; graphs)
    said = {json.loads(x).get("samples_from") for x in
            Store(db).events(d["run_id"], kinds=("loader",))["data"]}
    if kind in SAMPLES_FROM:
        assert said == {SAMPLES_FROM[kind]}, said
    if kind.startswith("multi_epochs"):  # one iterator kept across epochs (timm, and
        # Ultralytics' InfiniteDataLoader, made lazily): its batches' workers still read
        assert [w["batches"] > 0 for w in d["workers"]] == [True, True], d["workers"]
    # an evaluation pass over the training loader is counted apart, never as training:
    # with gradients off, and with the model in eval mode and gradients on (a new loader
    # over the training data in eval mode is not followed: its batches of 16 are not stored)
    assert d["evaluation_passes"] == (2 * EPOCHS if kind == "eval_pass" else 0), d
    if kind == "eval_pass":
        assert "evaluation pass over the training loader" in err, err[-2000:]
        passes = Store(db).events(d["run_id"], kinds=("evaluation",))["label"].tolist()
        assert [("gradients off" in x, "the model in eval mode" in x) for x in passes] == \
            [(True, False), (False, True)] * EPOCHS, passes
    # a step that puts the model back in training mode: its epochs are training, each step
    # timed (the first after an evaluation waited for its second batch to say so)
    assert ("puts the model in training mode inside its step" in err) == \
        (kind == "train_in_step"), err[-2000:]
    retune = d["retune"]
    if kind in ("multi_epochs", "multi_epochs_lazy", "combined"):
        assert retune["possible"] is False and retune["why"], retune
    else:
        assert retune == {"possible": True, "why": None}


def test_a_loader_that_holds_one_iterator_refuses_a_change_and_says_why(tmp_path, no_leaks):
    """timm's MultiEpochsDataLoader builds its iterator (and workers) once: a request for
    other workers cannot reach it, and is refused with the reason rather than 'applied'."""
    db = tmp_path / "m.db"
    p = start(db, "multi_epochs", "--workers", "1", "--epochs", "60")
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    assert wait_for(lambda: len(store.steps(1)) >= 2, timeout=120), p.stderr
    cid = store.request_control(1, "config", {"num_workers": 2})
    lines, err, d = finish(p)
    result = store.control_result(cid)[1] or ""
    assert result.startswith("refused") and "MultiEpochsDataLoader keeps one iterator" in \
        result, result
    assert d["config"]["num_workers"] == 1 and d["config"]["persistent_workers"] is True


def test_segments_a_killed_process_left_in_dev_shm_are_removed_and_a_live_ones_kept(no_leaks):
    """torch names a segment torch_<creator's pid>_<n>_<n>; one whose creator the kernel killed
    before it was unlinked stays in /dev/shm holding memory. Those of a dead process are
    removed; a live process's (this one's) and other files are left."""
    from monitor.probe.workers import remove_dead_segments

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    made = subprocess.run([sys.executable, "-c", "import os; n = f'torch_{os.getpid()}_7_1'; "
                           "open('/dev/shm/' + n, 'wb').write(b'x' * 4096); print(n)"],
                          capture_output=True, text=True, check=True)
    dead = made.stdout.strip()
    dead_pid = int(dead.split("_")[1])
    live = f"torch_{os.getpid()}_7_2"
    other = f"torchx_{dead_pid}_7_3"  # not torch's naming
    for name in (live, other):
        open(f"/dev/shm/{name}", "wb").close()
    try:
        assert remove_dead_segments([dead_pid, os.getpid()]) == [dead]
        left = set(os.listdir("/dev/shm"))
        assert dead not in left and live in left and other in left
        assert remove_dead_segments([dead_pid]) == []  # nothing more of it
    finally:
        for name in (dead, live, other):
            if os.path.exists(f"/dev/shm/{name}"):
                os.unlink(f"/dev/shm/{name}")


def _die(how: str) -> None:
    import signal

    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(3)


def test_how_a_loaders_workers_ended_is_said_in_torchs_words(no_leaks):
    """torch's "exited unexpectedly" (raised from a queue timeout) does not say that the
    kernel killed the worker; the worker processes' exit codes do."""
    import multiprocessing as mp

    from monitor.probe.workers import exit_note

    procs = [mp.get_context("fork").Process(target=_die, args=(how,)) for how in ("kill", "exit")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    note = exit_note(procs)
    assert f"DataLoader worker (pid {procs[0].pid}) is killed by signal: Killed." in note
    assert f"DataLoader worker (pid {procs[1].pid}) exited with code 3." in note
    assert exit_note([object()]) == ""  # not a process: nothing said, nothing raised


def _die_soon() -> None:
    import signal
    import time

    time.sleep(0.5)  # sleep-ok: the worker lives this long, then is killed
    os.kill(os.getpid(), signal.SIGKILL)


def test_an_error_a_death_raises_waits_for_the_workers_exit_code(no_leaks):
    """The OOM killer's kill lands while the main process is receiving the worker's batch:
    EOFError comes before the worker is reaped. The note waits for its exit code (a bounded
    poll); an error of the dataset's own is not delayed."""
    import multiprocessing as mp
    import time

    from monitor.probe.workers import DEATH_WAIT_S, exit_note

    p = mp.get_context("fork").Process(target=_die_soon)
    p.start()
    try:
        t0 = time.monotonic()
        assert exit_note([p], ValueError("a bad sample")) == ""  # alive: nothing to say
        assert time.monotonic() - t0 < 0.4
        note = exit_note([p], EOFError())
        assert f"DataLoader worker (pid {p.pid}) is killed by signal: Killed." in note, note
        assert time.monotonic() - t0 < DEATH_WAIT_S + 0.5
    finally:
        p.join(timeout=30)


@pytest.mark.parametrize("method", ["process", "thread"])
def test_a_torchdata_nodes_pipeline_is_timed_unmodified_in_its_own_terms(method, tmp_path,
                                                                          no_leaks):
    """torchdata.nodes: no torch DataLoader inside (once: nothing recorded unmodified; with
    watch(), num_workers 0 for a 2-worker ParallelMapper and advice of persistent_workers,
    which the API has not). Every step stored with the Batcher's 8 samples, the settings
    read from the nodes, advice only in the pipeline's terms."""
    db = tmp_path / "n.db"
    p = subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--json", "--",
         sys.executable, str(ROOT / "tests" / "scripts" / "nodes_loader.py"), method],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines, err, d = finish(p)
    assert lines == [f"epoch {e}: 6 batches, 48 samples" for e in range(3)], lines
    steps = Store(db).steps(d["run_id"])
    assert steps.groupby("epoch").size().to_dict() == {0: 6, 1: 6, 2: 6}, err[-2000:]
    assert set(steps["samples"]) == {8}
    c = d["config"]
    assert (c["loader_kind"], c["num_workers"], c["worker_method"], c["batch_size"],
            c["prefetch_factor"]) == ("torchdata.nodes", 2, method, 8, 2), c
    assert "ParallelMapper 2 " + method + " workers" in err, err[-2000:]
    assert d["retune"]["possible"] is False and "torchdata.nodes" in d["retune"]["why"]
    assert not [a for a in d["advice"] if a["param"] == "persistent_workers"], d["advice"]
    for a in d["advice"]:
        if a["param"] == "num_workers":
            assert a["reason"].startswith("ParallelMapper(num_workers="), a
            if method == "thread":  # not the model's to promise
                assert a["predicted_throughput"] is None and a["uncertain"], a


def test_a_nodes_pipeline_that_starts_its_workers_each_epoch_is_told_to_keep_one_iterator(
        tmp_path, no_leaks):
    """NOTE [one iterator for every epoch]: each iter() of a torchdata.nodes Loader starts its
    ParallelMapper's worker processes again (it has no persistent workers), and with spawn
    each is a new interpreter sent the map function. Named as the workers' start-up, with
    its start method and the map function's pickle, and the fix in the pipeline's terms: one
    iterator over every epoch (with a prediction), not persistent_workers (bare: spawn, 8
    epochs, 14.5 s against 2.5 s with one iterator)."""
    from monitor.diagnosis.costs import STARTUP
    from monitor.diagnosis.kinds import ONE_PASS

    db = tmp_path / "n.db"
    p = subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(db), "--json", "--",
         sys.executable, str(ROOT / "tests" / "scripts" / "nodes_loader.py"), "process", "2",
         "spawn", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines, err, d = finish(p)
    assert lines == [f"epoch {e}: 6 batches, 48 samples" for e in range(2)], lines
    started = next((f for f in d["findings"] if f["cause"] == STARTUP), None)
    assert started is not None, (d["verdict"], d["verdict_text"], err[-2000:])
    assert started["numbers"]["start_method"] == "spawn", started
    assert started["numbers"]["pickled_bytes"] > 0, started  # the map function, pickled
    assert "a torchdata.nodes ParallelMapper's, started at each iter(loader)" in \
        started["text"] and "the map function's object" in started["text"], started["text"]
    assert d["verdict"] == STARTUP, d["verdict_text"]
    first = d["advice"][0]
    assert (first["param"], first["value"]) == ("dataset", ONE_PASS), d["advice"]
    assert "itertools.islice" in first["reason"] and first["predicted_throughput"] > \
        d["throughput"], first
    assert not [a for a in d["advice"] if a["param"] == "persistent_workers"], d["advice"]


def test_a_nodes_pipelines_workers_and_what_each_receives_are_its_mappers():
    """A torchdata.nodes Loader's worker settings are its ParallelMapper's where it runs
    processes (threads start none), and what each worker receives is the map function, or
    the object a bound one holds (a dataset's __getitem__: the dataset)."""
    import torch
    import torchdata.nodes as tn

    from monitor.probe.loaders import shipped, workers_of

    class Data:
        def __getitem__(self, i: int) -> int:
            return i

    data = Data()

    def pipeline(fn, method: str) -> tn.Loader:
        return tn.Loader(tn.Batcher(tn.ParallelMapper(
            tn.SamplerWrapper(range(8)), map_fn=fn, num_workers=2, method=method,
            multiprocessing_context="spawn"), batch_size=4))

    bound = pipeline(data.__getitem__, "process")
    assert shipped(bound) is data
    assert getattr(workers_of(bound), "num_workers", None) == 2
    assert getattr(workers_of(bound), "multiprocessing_context", None) == "spawn"
    assert shipped(pipeline(abs, "process")) is abs
    assert workers_of(pipeline(abs, "thread")) is None
    loader = torch.utils.data.DataLoader(range(8), num_workers=2)
    assert workers_of(loader) is loader and shipped(loader) is loader.dataset
