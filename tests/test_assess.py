"""One assessment pipeline: the page, `measure --json`, `run --json` and `sweep --json` give
the same verdict and figures for the same window, and the accelerator kind a run recorded
(not its description) decides whether its device is simulated."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from monitor.assess.window import Context, assess_run
from monitor.config import LoaderConfig, max_workers
from monitor.diagnosis import fit_bound
from monitor.records import HostSample, StepRecord
from monitor.sampling.budget import cpu_budget, usable_cores

ROOT = Path(__file__).resolve().parent.parent
CONFIG = LoaderConfig.build(preset="starving", num_workers=0, batch_size=32,
                            step_time_ms=40.0)


def stored_run(store, kind: str = "simulated", status: str = "stopped",
               config: dict | None = None, run_kind: str = "managed",
               t0: float = 1_700_000_000.0, wait_s: float = 0.06) -> int:
    """A finished run of 20 s: a starving sawtooth (60 ms wait, 40 ms compute per step) with
    host samples at 4 Hz showing the main process loading on one core."""
    cfg = config if config is not None else CONFIG.to_dict()
    run = store.create_run("synthetic", run_kind, cfg)
    store.update_run(run, accelerator_kind=kind, accelerator=f"test device ({kind})")
    steps, t = [], t0
    for i in range(200):
        wait = wait_s + 0.01 * (i % 3)
        t += wait
        steps.append(StepRecord(run, i, i // 100, t, wait, 0.04, 32, 0))
        t += 0.04
    store.insert(steps)
    store.insert([HostSample(ts=t0 + k * 0.25, run_id=run, cpu_total_pct=50.0,
                             cpu_per_core=json.dumps([95.0, 5.0]), mem_used_mb=4000.0,
                             mem_total_mb=24000.0, mem_available_mb=20000.0,
                             shm_used_mb=1.0, proc_cpu_pct=95.0, proc_rss_mb=300.0,
                             workers=0, workers_cpu_pct=0.0, workers_rss_mb=0.0,
                             workers_uss_mb=0.0) for k in range(int((t - t0) / 0.25))])
    if status != "running":
        store.finish_run(run, status)
    return run


def context() -> Context:
    return Context(cpu_budget(), max_workers(usable_cores()))


KEYS = ("verdict", "steps", "window_s", "throughput", "data_wait_share", "device_busy_mean",
        "device_busy_cv")


def test_four_paths_agree_on_one_window(store, no_leaks, quiet_page):
    from monitor.manage.attached_summary import summary
    from monitor.manage.experiment import result_from_measurement
    from monitor.manage.measure import summarise

    run = stored_run(store)
    m = summarise(store, run, CONFIG, context())
    measure_json = json.loads(json.dumps(m.to_dict()))
    run_json = json.loads(json.dumps(summary(store, run, context()), default=str))
    sweep_json = json.loads(json.dumps(result_from_measurement(m, CONFIG, 20.0).to_dict()))
    for key in KEYS:
        assert measure_json[key] == run_json[key] == sweep_json[key], key
    assert measure_json["verdict"] == "starving"
    assert measure_json["advice"] == run_json["advice"] == sweep_json["advice"]

    at = quiet_page
    at.run()
    assert not at.exception
    assert at.selectbox(key="selected_run").value == run
    metrics = {x.label: x.value for x in at.metric}
    assert metrics["Throughput"] == f"{measure_json['throughput']:,.0f} samples/s"
    assert metrics["Data-wait share"] == f"{measure_json['data_wait_share']:.0%}"
    assert metrics["Device busy (mean)"] == f"{measure_json['device_busy_mean']:.0%}"
    banner = " ".join(e.value for e in at.error)
    assert banner.startswith(f"{measure_json['verdict']} · ")
    assert any("steady state of the final settings" in c.value for c in at.caption)


@pytest.mark.parametrize(("kind", "scales"), [("simulated", False), ("cuda", True),
                                               ("cpu", True)])
def test_the_stored_accelerator_kind_decides_simulation(store, kind, scales):
    a = assess_run(store, stored_run(store, kind), context())
    assert a.features.accelerator == kind and a.features.simulated is (not scales)
    model = fit_bound(a.features)
    assert model is not None and model.device_scales is scales
    assert a.to_dict()["accelerator_kind"] == kind


def test_attached_run_on_cuda_is_judged_as_cuda(store):
    """The probe records the kind from the script's torch; assess reads it back."""
    from monitor.probe import identity
    from tests.fakes.cuda import fake_torch

    with fake_torch(is_initialized=lambda: True, is_available=lambda: True):
        kind = identity.accelerator_kind()
    assert kind == "cuda"
    cfg = {"preset": "custom", "workload": "attached:train.py", "num_workers": 0,
           "batch_size": 32, "prefetch_factor": None, "pin_memory": False,
           "persistent_workers": False}
    a = assess_run(store, stored_run(store, kind, config=cfg, run_kind="attached"),
                   context())
    assert not a.features.simulated and fit_bound(a.features).device_scales


def test_attached_run_before_its_first_epoch_has_no_data_not_an_error(store):
    run = store.create_run("train.py", "attached",
                           {"preset": "custom", "workload": "attached:train.py"})
    a = assess_run(store, run, context())
    assert a.verdict == "no data" and a.features.steps == 0


def test_an_applied_prediction_is_set_beside_what_its_setting_measured():
    """An autotune move to 2 workers predicted 500 samples/s; the config event that applied
    it, then 20 steps at 16 samples per 20 ms: measured 800 after the batches in flight
    (4) are left out; a later prediction never applied has no outcome."""
    import numpy as np
    import pandas as pd

    from monitor.assess import outcomes

    two = {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False,
           "persistent_workers": True}
    ev = pd.DataFrame([
        {"ts": 0.0, "kind": "config", "label": "start",
         "data": json.dumps({**two, "num_workers": 0, "prefetch_factor": None})},
        {"ts": 9.0, "kind": "autotune", "label": "the bound model's knee",
         "data": json.dumps({**two, "rank": 0, "revert": False, "predicted": 500.0})},
        {"ts": 10.0, "kind": "config", "label": "num_workers 0→2", "data": json.dumps(two)},
        {"ts": 30.0, "kind": "autotune", "label": "one worker more",
         "data": json.dumps({**two, "num_workers": 3, "predicted": 900.0})},
    ])
    ts = np.r_[np.arange(20) * 0.5, 10.0 + np.arange(1, 21) * 0.02]
    steps = pd.DataFrame({"ts": ts, "wait_s": np.r_[np.full(20, 0.05), np.full(20, 0.01)],
                          "compute_s": 0.01, "samples": 16, "config_seq": [0] * 20 + [1] * 20,
                          "rank": 0})
    rows = outcomes.outcomes(ev, steps)
    assert [(r["change"], r["predicted"], r["steps"]) for r in rows] == [
        ("the bound model's knee", 500.0, 16), ("one worker more", 900.0, 0)]
    assert rows[0]["measured"] == pytest.approx(800.0)
    assert rows[0]["error"] == pytest.approx(-0.375) and rows[1]["measured"] is None
    assert not rows[0]["final"]  # its setting still runs: more steps may count
    later = steps.iloc[-1:].assign(ts=11.0, config_seq=2)  # the next move landed
    assert outcomes.outcomes(ev, pd.concat([steps, later]))[0]["final"]
    assert outcomes.error_line(rows) == ("predicted vs measured over 1 applied change: "
                                         "mean |error| 38%, 0 high, 1 low")


def test_outcomes_teach_the_machine_its_scale(tmp_path):
    """A first "device"-limited outcome measured 0.75 of its prediction: that limit's scale
    corrects fully; a second, predicted with it, measured on the mark: it stays; an outlier
    is clipped; another limit learns apart; an outcome of no known limit teaches nothing."""
    from monitor.assess import outcomes
    from monitor.manage.context import learn
    from monitor.store import Store

    store = Store(tmp_path / "s.db")
    assert outcomes.scale_of(store) == {} and learn(store, []) == {}
    dev = {"predicted": 400.0, "measured": 300.0, "limit": "device"}
    assert learn(store, [dev]) == {"device": 0.75}
    assert learn(store, [{**dev, "predicted": 300.0},
                                  {**dev, "measured": None},
                                  {**dev, "limit": None}]) == {"device": 0.75}
    assert outcomes.scale_of(Store(tmp_path / "s.db")) == {"device": 0.75}  # in the store
    got = learn(store, [{**dev, "predicted": 1000.0, "measured": 10.0},  # to 0.5
                                 {"predicted": 500.0, "measured": 550.0, "limit": "cores"}])
    assert got == {"device": pytest.approx(0.75 * (1 + (0.5 - 1) / 3), abs=1e-4),
                   "cores": 1.1}


def test_the_summary_keeps_the_cause_that_held_for_most_of_the_run(store):
    """One slow sample in 16 holds the in-order queue for the first 60 s (head-of-line in
    each 10 s window), then 40 s of plain starving waits: judged as one window the held
    waits are 42% of the wait (below head-of-line's half), but the run's summary names the
    cause of six of its ten windows, as the live view did, and its fix comes first."""
    from monitor.diagnosis import causes

    cfg = {**CONFIG.to_dict(), "num_workers": 4, "batch_size": 16}
    run = store.create_run("held", "attached", cfg)
    store.update_run(run, accelerator_kind="simulated", accelerator="test device")
    steps, t, i = [], 1_700_000_000.0, 0
    while t < 1_700_000_100.0:
        first = t < 1_700_000_060.0
        slow = first and i % 16 == 15
        wait = 0.3 if slow else (0.005 if first else 0.06)
        t += wait
        steps.append(StepRecord(run, i, 0, t, wait, 0.02, 16, 0, worker=i % 4,
                                held=3 if slow else 0))
        t += 0.02
        i += 1
    store.insert(steps)
    store.finish_run(run, "finished")
    whole = [x.cause for x in causes.find(store.steps(run), store.steps(run).iloc[0:0],
                                          {"num_workers": 4}, [], 100.0)]
    assert causes.HEAD_OF_LINE not in whole  # the run judged as one window misses it
    a = assess_run(store, run, context())
    d = a.to_dict()
    assert d["verdict"] == causes.HEAD_OF_LINE, (d["verdict"], d["verdict_text"])
    assert re.search(r"in [56] of the run.s (9|10) 10 s windows", d["verdict_text"]), \
        d["verdict_text"]
    assert d["advice"][0]["param"] == "in_order" and d["advice"][0]["value"] is False


def test_a_timed_loader_that_delivered_nothing_is_not_called_no_loader(store):
    """The probe timed a DataLoader (its `timing` event) that never delivered a batch, and
    the run ended with the watchdog's words: the summary says so, never "no DataLoader was
    iterated" (a tokenizer's deadlock once read that); a script with no loader still does."""
    from monitor.manage.attached_summary import summary
    from monitor.records import PROBE

    run = store.create_run("attached", "attached", {"num_workers": 2})
    store.add_event(run, PROBE, "timing DataLoader over DS, batch 4, 2 workers", {})
    store.finish_run(run, "failed", "no first batch after 31 s: the loader looks stuck")
    text = summary(store, run, context())["verdict_text"]
    assert text == ("The timed loader delivered no batch. No first batch after 31 s: the "
                    "loader looks stuck."), text
    bare = store.create_run("attached", "attached", {"num_workers": 2})
    store.finish_run(bare, "failed", "the script ended with exit code 0")
    assert "no torch DataLoader was iterated" in summary(store, bare, context())["verdict_text"]


def test_a_live_window_by_the_line_is_judged_as_the_runs_final_verdict_will_be(store):
    """NOTE [identical runs]: a running run's live window (the page's banner, Prometheus's
    verdict, the terminal view: assess/recent.py) is judged against the ends of earlier
    identical runs as its final verdict is: at 10.6% data wait beside an identical run that
    ended fed at 10.2%, healthy with the sentence that says why; a run of another identity,
    or with no earlier run, alone."""
    from monitor.assess import same_runs
    from monitor.assess.recent import read_recent
    from monitor.assess.window import assess
    from monitor.records import JUDGED

    cfg = LoaderConfig.build(preset="starving", num_workers=0, batch_size=32,
                             step_time_ms=40.0).to_dict()
    now = 1_700_000_000.0

    def running(identity: str) -> int:
        run = store.create_run("synthetic", "attached", cfg)
        store.update_run(run, accelerator_kind="simulated", accelerator="test device",
                         identity=identity)
        t, steps = now - 20.0, []
        for i in range(400):  # 10.6% of each step waits for data, ~2% either way
            wait = 0.00475 * (1.0 + 0.02 * ((i % 3) - 1))
            steps.append(StepRecord(run, i, 0, t + wait, wait, 0.04, 32, 0))
            t += wait + 0.04
        store.insert(steps)
        store.insert([HostSample(ts=now - 20.0 + k * 0.25, run_id=run, cpu_total_pct=50.0,
                                 cpu_per_core=json.dumps([95.0, 5.0]), mem_used_mb=4000.0,
                                 mem_total_mb=24000.0, mem_available_mb=20000.0,
                                 shm_used_mb=1.0, proc_cpu_pct=95.0, proc_rss_mb=300.0,
                                 workers=0, workers_cpu_pct=0.0, workers_rss_mb=0.0,
                                 workers_uss_mb=0.0) for k in range(80)])
        return run

    first = store.create_run("synthetic", "attached", cfg)
    store.update_run(first, identity="the same script")
    store.add_event(first, JUDGED, "ended healthy", {
        "share": 0.1016, "se": 0.0012, "fed": True, "config": cfg, "verdict": "healthy"})
    store.finish_run(first, "stopped")
    ctx = context()
    alone = assess(read_recent(store, running("another script"), now).window(0), ctx)
    assert 0.10 < alone.features.data_wait_share < 0.11, alone.features.data_wait_share
    assert not alone.features.fed and alone.verdict != "healthy", alone.diagnosis.headline
    # by the line, the share to a tenth ("waits for data 10%" read as at the line)
    assert re.search(r"waits for data 10\.\d% of step time", alone.diagnosis.headline), \
        alone.diagnosis.headline
    twin = read_recent(store, running("the same script"), now).window(0)
    assert twin.same_runs == tuple(same_runs.earlier(store, twin.run)) != ()
    live = assess(twin, ctx)
    assert live.verdict == "healthy" and live.features.judged_as["run"] == first, \
        live.diagnosis.headline
    assert f"as run {first} was" in live.diagnosis.headline
