"""torch.compile recompiling on changing shapes: the reproducer (tests/scripts/recompiles.py,
a model compiled with dynamic=False fed batches padded to their longest sequence) under
`monitor run --json` is named `recompiles` with its steps, the shapes that changed and the
fix; the same script with one shape (--buckets) is not. The finding's rules on frames."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from monitor.diagnosis.compiles import (
    RECOMPILES,
    described,
    mode_changes,
    recompiles,
    shape_changes,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "recompiles.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def monitored(db: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        "--", sys.executable, str(SCRIPT), *args], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_recompiles_on_new_shapes_name_the_steps_the_shapes_and_the_fix(tmp_path, no_leaks):
    d = monitored(tmp_path / "r.db", "--epochs", "4")
    assert d["verdict"] == RECOMPILES, (d["verdict"], d["verdict_text"])
    f = next(x for x in d["findings"] if x["cause"] == RECOMPILES)
    assert "torch.compile compiled again" in f["text"] and "dimension 1 took" in f["text"]
    assert f["numbers"]["recompiles"] >= 2 and f["numbers"]["slow_steps"], f
    first = d["advice"][0]
    assert first["param"] == "model" and "mark_dynamic(x, 1)" in first["reason"], first
    assert first["predicted_throughput"] > d["throughput"], (first, d["throughput"])
    assert not any(a["param"] == "num_workers" and a["value"] > 0 for a in d["advice"])
    # one shape for every batch: no recompile to name
    fixed = monitored(tmp_path / "b.db", "--epochs", "4", "--buckets")
    assert fixed["verdict"] != RECOMPILES and not any(
        x["cause"] == RECOMPILES for x in fixed["findings"]), fixed["verdict_text"]


def frame(compute: list[float], first: int = 0) -> pd.DataFrame:
    ts, rows = 1000.0, []
    for i, c in enumerate(compute):
        ts += 0.002 + c
        rows.append({"step": first + i, "ts": ts, "wait_s": 0.002, "compute_s": c})
    return pd.DataFrame(rows)


REASONS = ["0/1: tensor 'args[0]' size mismatch at index 1. expected 12, actual 17",
           "0/0: tensor 'args[0]' size mismatch at index 1. expected 10, actual 17",
           "0/2: tensor 'args[0]' size mismatch at index 0. expected 8, actual 5"]


def test_the_finding_counts_the_stalled_steps_and_says_the_shapes():
    steps = frame([0.01] * 10 + [0.4] + [0.01] * 10 + [0.5] + [0.01] * 8)
    report = {"compiles": [{"step": 30, "recompiles": 2, "reasons": REASONS}]}
    f = recompiles(steps, report, 100.0)
    assert f is not None and f.cause == RECOMPILES and f.no_more_workers and f.leads
    assert f.numbers["slow_steps"] == [10, 21] and f.numbers["recompiles"] == 2
    assert abs(f.numbers["lost_s"] - (0.39 + 0.49)) < 1e-9
    # the fixes: one shape (its gain: the lost time back), and drop_last for the short batch
    assert [a.param for a in f.advice] == ["model", "drop_last"]
    span = float(steps["ts"].max() - (steps["ts"] - steps["wait_s"] - steps["compute_s"]).min())
    assert f.advice[0].predicted_throughput == pytest.approx(100.0 * span / (span - 0.88))
    assert "dimension 1 took 3 sizes, 10 to 17" in f.text
    assert "the batch dimension: a short batch (5 of 8)" in f.text


def test_no_finding_without_a_recompile_or_a_stalled_step_in_the_window():
    steps = frame([0.01] * 10 + [0.4] + [0.01] * 10, first=100)
    assert recompiles(steps, {"compiles": []}, 100.0) is None
    assert recompiles(steps, None, 100.0) is None
    # the recompiles were read before this window's steps: they are not its
    assert recompiles(steps, {"compiles": [{"step": 40, "recompiles": 3, "reasons": REASONS},
                                           {"step": 90, "recompiles": 0}]}, 100.0) is None
    # recompiles with no stalled step (a compile cheaper than the noise): nothing to name
    flat = frame([0.01] * 20, first=100)
    assert recompiles(flat, {"compiles": [{"step": 120, "recompiles": 2}]}, 100.0) is None


# dynamo's guard failures (torch 2.13) for an evaluation inside the training loop of a
# compiled model: under torch.no_grad(), and after model.eval() with gradients on
MODE_REASONS = ["0/0: GLOBAL_STATE changed: grad_mode ",
                "0/0: fn._modules['1'].training == True                        # return "
                "F.dropout(input, self.p, self.training, self.inplace)  # nn/modules/"
                "dropout.py:73 in forward\nUser stack trace:\n  File ..."]


def test_a_recompile_for_a_new_mode_is_named_as_such_with_no_shape_advice():
    """NOTE [a recompile for a new mode]: an evaluation mid-epoch compiles a graph for its
    mode, once; padding batches would not help."""
    steps = frame([0.01] * 7 + [1.0] + [0.01] * 20)
    for reasons, said in ((MODE_REASONS[:1], "gradients on or off (torch.no_grad"),
                          (MODE_REASONS[1:], "the model's mode (model.eval()"),
                          (MODE_REASONS, "torch.no_grad, inference_mode) and of the model's")):
        f = recompiles(steps, {"compiles": [{"step": 20, "recompiles": len(reasons),
                                             "reasons": reasons}]}, 100.0)
        assert f is not None and f.advice == () and "new shapes" not in f.text, f
        assert said in f.text and "each compiled once" in f.text, f.text
        assert f.numbers["slow_steps"] == [7] and "1 step took 1.00 s against" in f.text
    assert mode_changes(MODE_REASONS) == ["grad_mode", "training"]
    # a shape's beside a mode's: the shapes are named, with their fix
    mixed = recompiles(steps, {"compiles": [{"step": 20, "recompiles": 3,
                                             "reasons": MODE_REASONS[:1] + REASONS}]}, 100.0)
    assert mixed is not None and "on new shapes" in mixed.text
    assert [a.param for a in mixed.advice] == ["model", "drop_last"]
    assert mode_changes(MODE_REASONS + REASONS) is None


def test_shape_changes_are_read_from_dynamos_guard_failures():
    assert shape_changes(REASONS) == [(1, 12, 17), (1, 10, 17), (0, 8, 5)]
    assert described([(0, 8, 5)]) == "the batch dimension: a short batch (5 of 8)"
    assert shape_changes(["0/0: ___check_obj_id(L['self'], 1401)"]) == []


def test_a_frame_that_hits_the_recompile_limit_is_seen_once_and_named():
    """Past dynamo's recompile_limit a frame's new shapes run uncompiled (torch warns once):
    the probe's look reads it from dynamo's own counters (no logging hook), once, and the
    finding says from which step on the steps it does not count ran eagerly."""
    import torch

    from monitor.probe.compiles import CompileWatch

    watch = CompileWatch()
    with torch._dynamo.config.patch(recompile_limit=2):
        f = torch.compile(lambda x: (x * 2).sum(), dynamic=False, backend="eager")
        f(torch.randn(3))
        first = watch.look(1)
        assert first is not None and not first["limit_hit"]
        for n in range(4, 8):
            f(torch.randn(n))
        hit = watch.look(5)
        f(torch.randn(9))  # uncompiled from now on: nothing new to say
        again = watch.look(6)
    torch._dynamo.reset()
    assert hit is not None and hit["limit_hit"] and hit["new_graphs"] == 1, hit
    assert again is None, again
    steps = frame([0.01] * 10 + [0.4] + [0.01] * 10 + [0.5] + [0.01] * 8)
    report = {"compiles": [{"step": 12, "recompiles": 2, "reasons": REASONS},
                           {"step": 25, "recompiles": 0, "reasons": [], "limit_hit": True}]}
    got = recompiles(steps, report, 100.0)
    assert got is not None and got.numbers["limit_hit_by_step"] == 25
    assert "By step 25 it hit dynamo's recompile_limit: shapes new since then run " \
        "uncompiled" in got.text, got.text
    del report["compiles"][1]
    assert "recompile_limit" not in recompiles(steps, report, 100.0).text
