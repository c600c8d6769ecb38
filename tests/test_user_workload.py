"""A user's own dataset as a managed workload: the spec, each error case, and real runs."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from monitor.config import ConfigError, LoaderConfig
from monitor.manage.session import SessionManager
from monitor.manage.workload_spec import check
from tests.conftest import wait_for
from tests.helpers import cli
from workloads.user import WorkloadError, load, parse_spec

HERE = Path(__file__).resolve().parent / "workloads"
GOOD = f"{HERE}/good.py:make"
BROKEN = f"{HERE}/broken.py"  # + ":factory"


@pytest.mark.parametrize(("text", "target", "attr", "is_file"), [
    ("examples/data.py:make", "examples/data.py", "make", True),
    ("pkg.mod:factory", "pkg.mod", "factory", False),
    ("/abs/path/x.py:Cls.build", "/abs/path/x.py", "Cls.build", True),
    ("C:/x.py:make", "C:/x.py", "make", True),
])
def test_spec_parser(text, target, attr, is_file):
    s = parse_spec(text)
    assert (s.target, s.attr, s.is_file) == (target, attr, is_file)


@pytest.mark.parametrize("text", ["", "no_colon", "file.py:", ":make", "not a module:f",
                                  "x.py:bad-name"])
def test_spec_parser_refuses(text):
    with pytest.raises(WorkloadError, match="workload spec|neither"):
        parse_spec(text)


def test_good_workloads_load():
    w = load(GOOD)
    assert len(w.dataset) == 2048 and not w.iterable and w.model_step is None
    d = load(f"{HERE}/good.py:make_dict")
    assert d.defaults == {"batch_size": 16, "num_workers": 1}
    assert callable(d.collate_fn) and callable(d.model_step)
    assert load(f"{HERE}/iterable.py:make").iterable


@pytest.mark.parametrize(("spec", "message"), [
    (f"{HERE}/nope.py:make", "workload file not found"),
    (f"{HERE}/import_error.py:make", "a_module_that_does_not_exist"),
    (f"{BROKEN}:missing", "has no 'missing'; callables there:"),
    (f"{BROKEN}:NOT_CALLABLE", "is a int, not a callable"),
    (f"{BROKEN}:wrong_type", "returned NoneType: return a torch.utils.data.Dataset"),
    (f"{BROKEN}:not_a_dataset", "is not a torch.utils.data.Dataset: subclass Dataset"),
    (f"{BROKEN}:raises_in_factory", "KeyError: 'missing_column'"),
    ("no_such_package_xyz.mod:make", "module 'no_such_package_xyz.mod' not found"),
])
def test_each_error_says_what_is_wrong(spec, message):
    with pytest.raises(WorkloadError) as e:
        load(spec)
    assert message in str(e.value)


def test_user_traceback_is_trimmed_to_their_frames():
    with pytest.raises(WorkloadError) as e:
        load(f"{BROKEN}:raises_in_factory")
    text = str(e.value)
    assert "broken.py" in text and "helper_that_fails" in text
    assert "workloads/user.py" not in text and "importlib" not in text


def test_check_runs_in_a_separate_process():
    ok = check(f"{HERE}/good.py:make_dict")
    assert ok["ok"] and ok["kind"] == "map-style" and ok["defaults"]["batch_size"] == 16
    bad = check(f"{BROKEN}:wrong_type")
    assert not bad["ok"] and "returned NoneType" in bad["error"]


def test_config_for_a_workload():
    cfg = LoaderConfig.build(workload=GOOD, num_workers=2)
    assert cfg.preset == "custom" and cfg.step_time_ms is None and cfg.prefetch_factor == 2
    with pytest.raises(ConfigError, match="PATH.py:CALLABLE"):
        LoaderConfig.build(workload="nocolon")
    with pytest.raises(ConfigError, match="runs as preset 'custom'"):
        LoaderConfig(preset="starving", workload=GOOD)


# -- real runs ------------------------------------------------------------------------------

@contextmanager
def managed(store, **settings):
    """A session manager for these settings, closed (and its workload reaped) after."""
    m = SessionManager(store, LoaderConfig.build(**settings))
    try:
        yield m
    finally:
        m.close()


def wait_status(store, run, timeout=90):
    """The run's record once it has ended (or still running at the deadline)."""
    wait_for(lambda: store.run(run)["status"] != "running", timeout=timeout, every=0.2)
    return store.run(run)


@pytest.mark.slow
def test_user_dataset_runs_and_reconfigures(store, no_leaks):
    with managed(store, workload=GOOD, batch_size=16, step_time_ms=5.0) as m:
        run = m.start()
        assert m.wait_for_steps(5, timeout=90), store.run(run)
        assert store.run(run)["accelerator"].startswith("simulated accelerator")
        cid = m.reconfigure(m.config.replace(num_workers=2))
        assert wait_for(lambda: store.control_result(cid)[1], timeout=30) == "ok"
        assert store.steps(run)["samples"].iloc[-1] == 16


@pytest.mark.slow
def test_user_model_step_and_collate(store, no_leaks):
    with managed(store, workload=f"{HERE}/good.py:make_dict", batch_size=16, num_workers=1) as m:
        run = m.start()
        assert m.wait_for_steps(5, timeout=90), store.run(run)
        assert "your model_step step()" in store.run(run)["accelerator"]
        assert store.steps(run)["compute_s"].median() >= 0.009  # its sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_raising_names_index_and_worker(store, no_leaks, workers):
    with managed(store, workload=f"{BROKEN}:raises_in_getitem", num_workers=workers) as m:
        r = wait_status(store, m.start())
        assert r["status"] == "failed"
        assert "corrupt record" in r["error"] and "for sample index" in r["error"]
        assert ("in worker" in r["error"]) == (workers > 0)
        assert ("in the main process" in r["error"]) == (workers == 0)
        # their words and their frames, not torch's re-raise around them
        assert r["error"].startswith("the dataset raised ValueError for sample index ") and \
            "torch/utils/data" not in r["error"] and "Caught" not in r["error"], r["error"]


def test_a_run_that_failed_before_its_first_batch_says_so_not_judging():
    from monitor.manage.result import result

    d = result(3, "failed", None, (None, None, None), "the dataset raised ValueError for "
               "sample index 7 in worker 0: bad\n  File ...", None, {})
    assert d["verdict_text"] == "The run failed before its first batch: the dataset raised " \
        "ValueError for sample index 7 in worker 0: bad"
    assert "verdict_text" not in result(3, "stopped", None, (None, None, None), None, None, {})

    class TooFew:  # an assessment of two steps
        def to_dict(self):
            return {"steps": 2, "verdict_family": "no data", "verdict_text": "Judging ..."}
    d = result(3, "failed", TooFew(), (None, None, None), "RuntimeError: boom", None, {})
    assert d["verdict_text"] == "The run failed after 2 step(s), too few to judge: " \
        "RuntimeError: boom"


@pytest.mark.slow
def test_a_killed_worker_of_a_managed_run_is_its_verdict_in_one_line(tmp_path, no_leaks):
    """NOTE [who killed the worker]: `measure` over a dataset whose worker is killed by
    SIGKILL (its own kill, not the OOM killer's): the run fails with torch's words and the
    kernel's count in one line (no traceback of wherever torch raised it), the verdict names
    the kill as another process's, and the command line says what to do."""
    r = cli("measure", "--workload", f"{BROKEN}:killed_worker", "--num-workers", "2",
            "--seconds", "30", "--json", db=tmp_path / "k.db")
    assert r.returncode == 1, r.stderr[-2000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["status"] == "failed" and "is killed by signal: Killed" in d["error"], d["error"]
    assert "Traceback" not in d["error"] and "\n" not in d["error"], d["error"]
    assert "; OOM kills since the run began: 0 on this host" in d["error"], d["error"]
    assert d["verdict"] == "worker-killed" and "not by the kernel's OOM killer" in \
        d["verdict_text"], (d["verdict"], d["verdict_text"])
    assert "What to do: not the OOM killer" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_unpicklable_dataset_with_spawned_workers_says_why(store, no_leaks):
    with managed(store, workload=f"{BROKEN}:unpicklable", num_workers=1) as m:
        r = wait_status(store, m.start())
        assert r["status"] == "failed"
        assert "cannot be pickled for worker processes started with 'spawn'" in r["error"]
        assert "lambda" in r["error"]


@pytest.mark.slow
def test_iterable_dataset_runs(store, no_leaks):
    with managed(store, workload=f"{HERE}/iterable.py:make", num_workers=2, step_time_ms=2.0) as m:
        m.start()
        assert m.wait_for_steps(10, timeout=90)
