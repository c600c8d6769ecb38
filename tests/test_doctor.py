"""`monitor doctor` against fixtures (a small /dev/shm, a low ulimit, cgroup limits, no
schedstat) and once for real."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from monitor.cli import doctor
from monitor.records import CpuBudget
from monitor.sampling.gpu import NoGpu

ROOT = Path(__file__).resolve().parent.parent


def test_a_docker_default_shm_fails_with_the_flag_to_use():
    c = doctor.shm_check(64.0)
    assert c.status == doctor.FAIL and "--shm-size" in c.todo
    assert doctor.shm_check(8192.0).status == doctor.OK


def test_low_limits_fail_and_unlimited_passes():
    c = doctor.limit_check("ulimit -n (open files)", 1024, doctor.MIN_NOFILE, "raise it")
    assert c.status == doctor.FAIL and c.what == "ulimit -n (open files) is 1024"
    assert doctor.limit_check("x", resource.RLIM_INFINITY, 10, "").status == doctor.OK


def test_cgroup_quota_throttling_and_memory():
    checks = doctor.cgroup_check(CpuBudget(8, 2.0, 2, 0.3, 12.0), 4000.0)
    text = [c.line() for c in checks]
    assert checks[0].status == doctor.WARN and "quota 2 cores of 8" in text[0]
    assert "throttled in 30%" in text[1] and "4,000 MB" in text[2]


def test_missing_schedstat_and_io_say_what_the_verdicts_do(tmp_path):
    checks = doctor.proc_check({"schedstat": False, "io": False})
    assert all(c.status == doctor.WARN for c in checks)
    assert "instead of guessing" in checks[0].todo and "never claimed" in checks[1].todo


def test_no_nvml_is_a_warning_with_the_fix():
    (c,) = doctor.nvml_check(NoGpu("NVML library not found"))
    assert c.status == doctor.WARN and "nvidia-ml-py" in c.todo


def test_a_store_whose_folder_cannot_be_made_fails(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("a file where the store's folder should be")
    c = doctor.store_check(blocker / "m.db")
    assert c.status == doctor.FAIL and "--db" in c.todo
    assert doctor.store_check(tmp_path / "m.db").status == doctor.OK


def test_doctor_runs_here_and_names_the_cpu_torch(tmp_path):
    r = subprocess.run([sys.executable, "-m", "monitor", "doctor", "--db",
                        str(tmp_path / "m.db")], cwd=ROOT, capture_output=True, text=True,
                       timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT),
                                         "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode in (0, 1), r.stderr
    assert "torch 2." in r.stdout and "/dev/shm" in r.stdout and "schedstat" in r.stdout
    assert r.stdout.strip().splitlines()[-1].endswith("failing")
    # what the CPUs do together: measured and kept, or (other jobs busy) why not
    kept = tmp_path / "cache" / "starvation-monitor" / "capacity.json"
    if "CPUs do " in r.stdout:
        assert kept.exists() and "x one CPU's work together (measured" in r.stdout
    else:
        assert "the CPUs' capacity: not measured" in r.stdout and "quieter box" in r.stdout


def test_torchvision_built_for_another_torch_is_named_with_the_pair_to_install():
    """pip replaced torch 2.14.1 with 2.13.0 under a torchvision 0.29.1 (its wheel pins
    torch==2.14.1): the import fails and timm with it; doctor names both versions."""
    bad = doctor.vision_check({"v": "2.13.0+cpu", "tv": "0.29.1",
                               "tv_needs": ["torch==2.14.1"],
                               "tv_error": "RuntimeError: operator torchvision::nms does "
                                           "not exist"})
    assert bad.status == doctor.FAIL
    assert "built for torch 2.14.1" in bad.what and "2.13.0+cpu" in bad.what
    assert "torch==2.14.1 torchvision==0.29.1" in bad.todo
    ok = doctor.vision_check({"v": "2.14.1+cu128", "tv": "0.29.1",
                              "tv_needs": ["torch==2.14.1"]})
    assert ok.status == doctor.OK
    broken = doctor.vision_check({"v": "2.14.1", "tv": "0.29.1", "tv_needs": [],
                                  "tv_error": "ImportError: libcudart.so.12"})
    assert broken.status == doctor.FAIL and "does not import" in broken.what


def test_a_declared_loader_is_checked_against_shm_and_the_open_files_limit():
    """Before a run: 4 workers x prefetch 2 of 12 MB batches need 108 MB of /dev/shm (a
    container's 64 MB fails); 300 tensors a batch need 2,700 descriptors (1024 fails)."""
    shm, fds = doctor.in_flight_check(64.0, 1024, 12.0, 300, 4, 2)
    assert shm.status == doctor.FAIL and "need 108 MB" in shm.what and "--shm-size" in shm.todo
    assert fds.status == doctor.FAIL and "2,700" in fds.what
    ok = doctor.in_flight_check(8192.0, 65536, 12.0, 300, 4, 2)
    assert [c.status for c in ok] == [doctor.OK, doctor.OK]


def test_spawn_and_forkserver_workers_are_said_to_start_every_epoch():
    assert doctor.start_method_check("fork").status == doctor.OK
    c = doctor.start_method_check("forkserver")
    assert c.status == doctor.WARN and "persistent_workers=True" in c.todo


def test_a_slurm_grant_below_the_mask_is_a_warning_with_the_flag():
    checks = doctor.cgroup_check(CpuBudget(16, None, 4, None, None, 4), None)
    warn = [c for c in checks if "Slurm grants 4 CPUs a task" in c.what]
    assert warn and warn[0].status == doctor.WARN and "--cpus-per-task" in warn[0].todo
    assert not any("Slurm" in c.what for c in doctor.cgroup_check(
        CpuBudget(16, None, 16, None, None), None))
