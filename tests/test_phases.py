"""Where a step's compute goes, with no line of the script changed (monitor/probe/phases.py):
a plain script whose forward, backward and optimizer step have known, different costs
(tests/scripts/phases.py, no monitor imports) under `monitor run --json`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.store import Store
from tests.conftest import leak_checked

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "phases.py"
pytestmark = pytest.mark.slow
# ms: large beside the per-call overheads of autograd and a busy box's wake-ups
COSTS = {"forward": 20.0, "backward": 40.0, "optimizer": 10.0}


def measured(r: subprocess.CompletedProcess) -> dict[str, float]:
    """What each phase took by the script's own clock (ms a step): a busy box wakes the
    sleeps late (a forward of 20 ms read 24.3 beside two busy cores), the probe must read
    what happened. Each is at least its nominal cost (a sleep is never short)."""
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("measured ms: "))
    took = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[2:])}
    for name, ms in COSTS.items():
        assert took[name] >= ms, (name, took)
    return took
ARGS = ("--forward-ms", "20", "--backward-ms", "40", "--optimizer-ms", "10",
        "--other-ms", "5", "--epochs", "2")


def monitored(db: Path, *args: str, flags: tuple = ()) -> tuple[subprocess.CompletedProcess,
                                                                dict]:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        *flags, "--", sys.executable, str(SCRIPT), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def nested_and_saved(tmp_path_factory):
    """One run for the two tests below that read it (their xdist group keeps them on one
    worker): 50 layers inside the model (its root alone is timed), the whole model saved
    and deep-copied after each epoch; each once had a run of its own (4 CPU-s, an
    interpreter and torch). The known costs keep a run of the plain model: beside a loaded
    suite the 50 layers' optimizer step read 41 ms against the script's own 33."""
    folder = tmp_path_factory.mktemp("phases")
    with leak_checked("the phases run"):
        r, d = monitored(folder / "p.db", *ARGS, "--nested", "50", "--save",
                         str(folder / "model.pt"))
    return r, d, folder


ONE_RUN = pytest.mark.xdist_group("phases-nested-and-saved")


def test_the_phases_of_each_step_match_their_known_costs(tmp_path, no_leaks):
    db = tmp_path / "p.db"
    r, d = monitored(db, *ARGS)
    ph = d["phases"]
    assert ph is not None and ph["source"] == "host time", d
    per, took = ph["seconds_per_step"], measured(r)
    for name in COSTS:
        assert per[name] * 1000 == pytest.approx(took[name], rel=0.2), (name, per, took)
    assert per["other"] * 1000 == pytest.approx(took["other"], abs=3.0), (per, took)
    assert sum(ph[p] for p in ("data_wait", "copy", "forward", "backward", "optimizer",
                               "other")) == pytest.approx(1.0)
    assert d["verdict"] == "healthy"
    # the sentence says the probe's own figures (the backward's share moves with the box's
    # load: 45% beside busy neighbours, 5x% quiet), not a fixed number
    assert f"The step is {ph['backward']:.0%} backward (forward {ph['forward']:.0%}" in \
        d["verdict_text"], (d["verdict_text"], ph)
    steps = Store(db).steps(d["run_id"])
    assert steps["forward_s"].notna().all() and steps["optimizer_s"].notna().all()
    labels = Store(db).events(d["run_id"], kinds=("probe",))["label"].tolist()
    assert "step phases: the forward pass timed at Model (the outermost modules the loop " \
        "calls)" in labels, labels


@ONE_RUN
def test_a_nested_model_is_timed_at_its_root_alone(nested_and_saved):
    """50 layers inside the model: after discovery the hooks are the root's own, so the
    forward still reads its cost (not 50 layers' worth of hook calls), and only the root
    is named."""
    r, d, folder = nested_and_saved
    db = folder / "p.db"
    per = d["phases"]["seconds_per_step"]
    took = measured(r)["forward"]
    assert per["forward"] * 1000 == pytest.approx(took, rel=0.2), (per, took)
    labels = Store(db).events(d["run_id"], kinds=("probe",))["label"].tolist()
    assert any(x.startswith("step phases: the forward pass timed at Model (") for x in labels)
    assert not any("Layer" in x for x in labels), labels


def test_transforms_called_inside_next_are_the_loaders_work_not_the_forward(tmp_path,
                                                                          no_leaks):
    """torchvision's transforms are modules, called at 0 workers on the training thread
    inside next(loader): they are not forward roots (once listed as `RandomResizedCrop,
    ..., MobileNetV3`, their time counted twice and "other" read 0); named as the loader's."""
    db = tmp_path / "t.db"
    r, d = monitored(db, *ARGS, "--transform-ms", "1.5")
    per, took = d["phases"]["seconds_per_step"], measured(r)
    assert per["forward"] * 1000 == pytest.approx(took["forward"], rel=0.2), (per, took)
    assert per["other"] * 1000 == pytest.approx(took["other"], abs=3.0), (per, took)
    labels = Store(db).events(d["run_id"], kinds=("probe",))["label"].tolist()
    said = [x for x in labels if x.startswith("step phases: the forward pass timed at ")]
    assert said and said[0].startswith("step phases: the forward pass timed at Model (") and \
        "Jitter ran inside next(loader): the loader's work" in said[0], labels


@ONE_RUN
def test_a_model_saved_whole_and_deep_copied_carries_nothing_of_the_probe(nested_and_saved):
    """`torch.save(model)` and `copy.deepcopy(model)` each epoch (pytorch/examples'
    word_language_model saves the whole model; an EMA deep-copies it): both work with the
    phases timed, and the saved file holds no hook and no reference to this package (an
    instance hook on the root made torch.save raise "Can't pickle local object")."""
    r, d, folder = nested_and_saved
    saved = folder / "model.pt"
    assert "saved whole: Model, 0 hooks" in r.stdout, r.stdout
    assert b"monitor" not in saved.read_bytes()
    per = d["phases"]["seconds_per_step"]
    took = measured(r)["forward"]
    assert per["forward"] * 1000 == pytest.approx(took, rel=0.2), (per, took)


def test_an_optimizer_that_is_not_a_torch_one_is_other_and_said(tmp_path, no_leaks):
    bare = subprocess.run([sys.executable, str(SCRIPT), *ARGS, "--plain-optimizer"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    db = tmp_path / "o.db"
    r, d = monitored(db, *ARGS, "--plain-optimizer")
    own = ("{", "measured ms: ")  # monitor run's JSON; the script's own clock's figures
    assert [x for x in r.stdout.splitlines() if not x.startswith(own)] == \
        [x for x in bare.stdout.splitlines() if not x.startswith(own)]
    per = d["phases"]["seconds_per_step"]
    assert per["optimizer"] == 0.0 and per["other"] * 1000 >= 10.0, per  # its 10 ms: other
    assert "not a torch.optim.Optimizer's" in r.stderr
    assert Store(db).steps(d["run_id"])["optimizer_s"].isna().all()


def test_no_phases_turns_the_hooks_off(tmp_path, no_leaks):
    r, d = monitored(tmp_path / "x.db", *ARGS, flags=("--no-phases",))
    assert d["phases"] is None and "The step is" not in d["verdict_text"]


@pytest.mark.parametrize("compiled", ["module", "function", "optimizer"])
def test_a_compiled_model_is_compiled_once_with_the_phases_on(tmp_path, no_leaks, compiled):
    """torch.compile under the probe (timm --torchcompile, nanoGPT, the HF Trainer's
    torch_compile, PyTorch's compiled optimizer step): the phase hooks that dynamo traces
    return at once (a hook that read the thread id made dynamo break the graph and run the
    model uncompiled), the discovery hooks stay where dynamo guarded on their count
    (removing them recompiled the model at the third step), and nothing is swapped between
    sampled steps once the script has asked to compile (NOTE [phase sampling]: a compiled
    `opt.step` was retraced at each swap of the optimizer's hooks). The script compiles what
    it compiles bare, with the graph breaks it has bare; no warning of ours reaches its
    stderr."""
    epochs = 8 if compiled == "optimizer" else 3  # (steps enough for the sampling's swaps)
    script = [sys.executable, str(ROOT / "tests" / "scripts" / "compiled.py"), "--compiled",
              compiled, "--epochs", str(epochs)]
    db = tmp_path / "c.db"
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        "--", *script], cwd=ROOT, capture_output=True, text=True,
                       timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    dynamo, d = lines[0], lines[-1]
    if compiled == "optimizer":  # torch's own graph break there (its profiler's record)
        bare = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=240)
        want = json.loads(bare.stdout.splitlines()[-1])
        assert (dynamo["graphs"], dynamo["graph_breaks"]) == \
            (want["graphs"], want["graph_breaks"]), (dynamo, want, r.stderr[-3000:])
    else:
        assert dynamo["graphs"] == 1 and dynamo["graph_breaks"] == 0, \
            (dynamo, r.stderr[-3000:])
    assert "global hooks" not in r.stderr and "Dynamo does not know" not in r.stderr, r.stderr
    assert "step phases off" not in r.stderr, r.stderr
    assert len(Store(db).steps(d["run_id"])) == epochs * 16
    per = d["phases"]["seconds_per_step"]
    assert per["backward"] > 0, per
    # a compiled optimizer step runs its hooks as dynamo traced them (they return at once):
    # its time is other
    assert (per["optimizer"] == 0.0) if compiled == "optimizer" else per["optimizer"] > 0, per
    if compiled == "function":  # the model is called only inside compiled code: its time
        assert per["forward"] == 0.0, per  # is the loop's, other
    else:  # the model (compiled, or not) is called by the loop: its forward
        assert per["forward"] > 0, per
