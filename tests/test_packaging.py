"""The project installs as a package: a wheel with monitor/ and workloads/, the runtime
requirements as its dependencies and the `starvation-monitor` console script; installed
elsewhere, `python -m monitor` works from any folder and a managed run finds its workload."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# one worker builds the one wheel (`--dist loadgroup`)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tree: setuptools builds in the source folder (build/), and two
    test workers building there at once collide (CI: "File exists: build/bdist..."). The
    venvs are left out (.venv-vision alone is 6 GB: the copy took 85 s a worker)."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "tree"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".ruff_cache", ".whl", ".gl", "runs", "artifacts", "*.db", "*.db-wal", "*.db-shm"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                        str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return next(out.glob("starvation_monitor-*.whl"))


def test_wheel_holds_the_packages_the_dependencies_and_the_console_script(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for path in ("monitor/probe/patch.py", "monitor/probe/_inject/sitecustomize.py",
                 "monitor/ui/app.py", "monitor/ui/_serve/dashboard.py", "workloads/runner.py"):
        assert path in names, path
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    wanted = [ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text()
              .splitlines() if ln.split("#")[0].strip()]
    deps = [ln[len("Requires-Dist: "):] for ln in meta.splitlines()
            if ln.startswith("Requires-Dist: ")]
    from packaging.requirements import Requirement

    def norm(reqs: list[str]) -> list[tuple[str, object]]:
        return [(r.name, r.specifier) for r in map(Requirement, reqs)]

    base = [d for d in deps if "extra ==" not in d]  # an extra's needs are not the base's
    assert norm(base) == norm(wanted)
    extras = {ln.split(":", 1)[1].strip() for ln in meta.splitlines()
              if ln.startswith("Provides-Extra:")}
    assert {"tensorboard", "wandb", "notebook"} <= extras  # --tensorboard's, --wandb's: where asked
    assert "starvation-monitor = monitor.cli.main:console" in entry


def test_the_package_never_asks_to_replace_an_installed_torch(wheel):
    """A user's `pip install` keeps the torch (and torchvision) of their training venv: the
    package declares torch with no upper bound, so a newer release satisfies it as it is;
    this checkout's own venv is pinned through constraints.txt, which make passes to pip."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    reqs = [Requirement(ln[len("Requires-Dist: "):]) for ln in meta.splitlines()
            if ln.startswith("Requires-Dist: ")]
    torch = [r for r in reqs if r.name == "torch"]
    assert len(torch) == 1 and not [r for r in reqs if r.name == "torchvision"]
    for installed in ("2.13.0+cpu", "2.14.1", "2.14.1+cu128", "3.0.0"):
        assert torch[0].specifier.contains(installed, prereleases=True), installed
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt" in makefile
    assert "torch" in (ROOT / "constraints.txt").read_text()


def test_installed_elsewhere_it_runs_from_any_folder(wheel, tmp_path):
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--target", str(site), str(wheel)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}  # our dependencies from this venv
    r = subprocess.run([sys.executable, "-m", "monitor", "measure", "--preset", "healthy",
                        "--seconds", "2", "--json", "--db", str(tmp_path / "m.db")],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert '"verdict"' in r.stdout.splitlines()[-1]
    assert not (elsewhere / "runs").exists()  # the store went where --db said
