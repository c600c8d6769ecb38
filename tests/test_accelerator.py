"""The accelerator step: simulated timing, and the torch model step run on the CPU (the same
code that runs on CUDA, minus the synchronize)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from workloads.accelerator import SimulatedAccelerator, TorchAccelerator, make_accelerator


def batch(n=8, size=16):
    return torch.rand(n, 3, size, size), torch.randint(0, 10, (n,))


def timed(acc, b, n=5) -> float:
    t = time.perf_counter()
    for _ in range(n):
        acc.step(b)
    return (time.perf_counter() - t) / n


def test_simulated_holds_the_device_for_the_step_time():
    acc = SimulatedAccelerator(30.0)
    assert 0.025 < timed(acc, batch()) < 0.2
    acc.configure(5.0, "auto")
    assert timed(acc, batch()) < 0.1
    assert "simulated accelerator" in acc.description and acc.device_info() is None


def test_auto_model_is_calibrated_to_the_step_time(monkeypatch):
    """A step of the auto model is `repeats` training passes, `repeats` = the step time over
    one pass as timed at calibration. The pass's time is scripted here (5 ms on a clock of
    our own): on a shared 2-core machine a pass's real time changes from one second to the
    next, so only the arithmetic is checkable, and that a step really runs `repeats` passes."""
    import workloads.accelerator as accel

    torch.set_num_threads(1)
    acc = TorchAccelerator("auto", 60.0, device="cpu")
    now = [0.0]
    passes = []
    real = acc._train_pass

    def scripted(x, y):
        real(x, y)  # the real pass (it trains), then 5 ms on the scripted clock
        now[0] += 0.005
        passes.append(1)
    monkeypatch.setattr(acc, "_train_pass", scripted)
    monkeypatch.setattr(accel.time, "perf_counter", lambda: now[0])
    b = batch()
    acc.step(b)  # calibrates: 2 warm-up passes, 3 timed ones, then the step's own
    assert acc.repeats == 12  # 60 ms / 5 ms
    assert len(passes) == 2 + 3 + 12
    passes.clear()
    acc.step(b)
    assert len(passes) == 12
    assert "12 passes/step" in acc.description and acc.device_info() is None


def test_fixed_model_sizes_run_one_pass_and_learn():
    acc = TorchAccelerator("small", 0.0, device="cpu")
    assert acc.repeats == 1
    x, y = batch(32)
    before = [p.detach().clone() for p in acc.model.parameters()]
    acc.step((x, y))
    assert any(not torch.equal(a, p) for a, p in zip(before, acc.model.parameters(),
                                                      strict=True))
    acc.configure(0.0, "medium")
    assert acc.model_size == "medium" and acc.repeats == 1


def test_make_accelerator_forced_simulated(monkeypatch):
    monkeypatch.setenv("STARVATION_MONITOR_SIMULATE", "1")
    assert isinstance(make_accelerator(10.0, "auto"), SimulatedAccelerator)


def test_user_model_step_is_a_real_device_never_simulated(monkeypatch):
    """A user's model_step runs on CUDA where CUDA is available: the run records "cuda" and
    is judged as a GPU run (monitor/assess/window.py reads the kind back)."""
    from workloads.accelerator import UserStep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert UserStep(lambda batch: None).kind == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert UserStep(lambda batch: None).kind == "cpu"
    assert SimulatedAccelerator(10.0).kind == "simulated"


@pytest.mark.gpu
def test_cuda_step_copies_trains_and_reports_its_device(monkeypatch):
    """On a GPU machine: make_accelerator picks CUDA when simulation is off, a step copies
    the batch (copy time measured with CUDA events) and names the device for NVML."""
    monkeypatch.setenv("STARVATION_MONITOR_SIMULATE", "0")
    acc = make_accelerator(5.0, "small")
    assert acc.kind == "cuda" and acc.description.startswith("CUDA ")
    copy_s = acc.step(batch(32, 32))
    assert copy_s is not None and 0.0 <= copy_s < 1.0
    info = acc.device_info()
    assert info["uuid"].startswith("GPU-") and info["cuda_index"] == 0


@pytest.mark.gpu
def test_cuda_events_see_the_starved_device_of_an_async_script(tmp_path):
    """On a GPU machine: bench/async_train.py (no per-step sync) under `monitor run`. The
    device's own idle between steps (CUDA events) is high at num_workers=0 and low at 4, and
    the event-derived busy agrees with NVML's utilization within 25 points."""
    import json
    import subprocess
    import sys

    from monitor.store import Store

    root = Path(__file__).resolve().parent.parent
    db = tmp_path / "a.db"
    shares = {}
    for nw in (0, 4):
        r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                            "--no-live", "--", sys.executable,
                            str(root / "bench" / "async_train.py"), "--num-workers", str(nw),
                            "--seconds", "20"], cwd=root, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout.strip().splitlines()[-1])
        ev = d["evidence"]
        assert ev["device_busy_source"] == "CUDA events", ev
        shares[nw] = ev["device_idle_share"]
        store = Store(db)
        steps = store.steps(d["run_id"])
        util = store.gpu_util(float(steps["ts"].min()), float(steps["ts"].max()))
        if len(util):
            assert abs(ev["device_busy_mean"] * 100 - util["util_pct"].mean()) <= 25, (
                ev["device_busy_mean"], util["util_pct"].mean())
    assert shares[0] >= 0.3 and shares[4] <= shares[0] / 2, shares
