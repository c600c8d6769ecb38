"""DESIGN.md's process and layer boundaries, checked: the dashboard's modules never import
torch; the probe imports in a training interpreter that has torch but not pandas, numpy,
psutil or streamlit; no import cycle between monitor's modules (TYPE_CHECKING and lazy
imports included); the file-level arrows a folder rule cannot express; and ruff's folder
rules (monitor/*/ruff.toml) in force."""
from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import sys
import monitor.ui.resources, monitor.ui.panels, monitor.ui.controls, monitor.ui.sweep_panel
import monitor.ui.charts, monitor.diagnosis, monitor.tuning.search, monitor.manage.jobs
import monitor.manage.experiment, monitor.manage.measure, monitor.assess.window
import monitor.manage.runtime, monitor.probe.patch, monitor.manage.attached_run, monitor.cli.main
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""

# A user's training venv: torch (if at all), the standard library, nothing of ours beyond
# monitor/. Every module of the probe folder, and what it imports, must load there.
FENCE = """
import importlib, importlib.abc, pkgutil, sys
BLOCK = {"pandas", "numpy", "psutil", "streamlit", "plotly", "pyarrow", "pynvml",
         "prometheus_client", "tsdownsample"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError(f"No module named {name!r} (blocked: not in a training venv)")
sys.meta_path.insert(0, Block())
import monitor.probe
names = ["monitor.probe." + m.name for m in pkgutil.iter_modules(monitor.probe.__path__)
         if not m.name.startswith("_")]
for name in names:
    importlib.import_module(name)
print(len(names), sorted(m.split(".")[0] for m in sys.modules if m.split(".")[0] in BLOCK))
"""

PURE = ["monitor.manage", "monitor.ui", "monitor.sampling", "monitor.manage.experiment",
        "monitor.manage.jobs", "psutil", "subprocess", "multiprocessing", "streamlit",
        "torch", "workloads"]
# (files, module prefixes they may not import): the arrows inside a folder
FORBIDDEN = [
    ("monitor/*", ["torch", "workloads"]),
    ("monitor/frames/analysis.py", PURE + ["monitor.store", "monitor.assess",
                                           "monitor.diagnosis"]),
    ("monitor/tuning/search.py", PURE + ["monitor.store", "monitor.assess"]),
    ("monitor/tuning/policy.py", PURE + ["monitor.store", "monitor.assess", "pandas"]),
    ("monitor/assess/compare.py", ["monitor.manage"]),
    ("workloads/*", ["monitor.ui", "monitor.manage", "streamlit", "pynvml"]),
]


def imports(path: Path) -> set[str]:
    """Every module a file imports, absolute (`from a import b` counts as a and a.b)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def violations() -> list[str]:
    bad = []
    files = [p for d in ("monitor", "workloads") for p in (ROOT / d).rglob("*.py")]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        mods = imports(path)
        for pattern, banned in FORBIDDEN:
            if not fnmatch.fnmatch(rel, pattern):
                continue
            for m in mods:
                if any(m == b or m.startswith(b + ".") for b in banned):
                    bad.append(f"{rel} imports {m} (rule {pattern})")
    return bad


def module_graph(root: Path) -> dict[str, set[str]]:
    """monitor's modules and the monitor modules each imports, anywhere in the file
    (module level, functions, TYPE_CHECKING blocks). `from pkg import mod` is an arrow to
    pkg.mod; to pkg itself only when a name that is not a module is imported from it."""
    def name(p: Path) -> str:
        parts = list(p.relative_to(root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name(p): p for p in (root / "monitor").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(files)
                if len(subs) < len(node.names) and node.module in files:
                    subs.add(node.module)
                deps |= subs
        graph[mod] = deps - {mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_dashboard_process_never_imports_torch():
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_app_script_imports_no_torch_directly():
    for page in (ROOT / "app.py", ROOT / "monitor" / "ui" / "app.py"):
        assert not {m for m in imports(page) if m.split(".")[0] == "torch"}


def test_probe_imports_in_a_training_venv_without_our_dependencies():
    """Each probe module loads with pandas, numpy, psutil, streamlit, plotly, pynvml and the
    rest unimportable, and none of them is loaded behind its back."""
    r = subprocess.run([sys.executable, "-c", FENCE], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    count, loaded = r.stdout.split(" ", 1)
    assert int(count) >= 6 and loaded.strip() == "[]", r.stdout


def test_the_fence_catches_a_heavy_import(tmp_path):
    """The same check fails when a probe module reaches pandas."""
    pkg = tmp_path / "monitor" / "probe"
    pkg.mkdir(parents=True)
    (tmp_path / "monitor" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("import pandas\n")
    r = subprocess.run([sys.executable, "-c", FENCE], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "blocked: not in a training venv" in r.stderr


def test_no_import_cycles_between_monitor_modules():
    graph = module_graph(ROOT)
    assert len(graph) > 60 and "monitor.probe.patch" in graph
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle_through_type_checking(tmp_path):
    (tmp_path / "monitor").mkdir()
    (tmp_path / "monitor" / "__init__.py").write_text("")
    (tmp_path / "monitor" / "a.py").write_text("from monitor.b import x\n")
    (tmp_path / "monitor" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from monitor import a\n")
    assert cycles(module_graph(tmp_path)) == [["monitor.a", "monitor.b"]]


def folder_graph(root: Path) -> dict[str, set[str]]:
    """monitor's folders (monitor.assess, monitor.probe, ...) and the folders their modules
    import (module_graph's arrows, lifted: a module directly under monitor/ is its own)."""
    def folder(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for mod, deps in module_graph(root).items():
        graph.setdefault(folder(mod), set()).update(folder(d) for d in deps)
    return {f: deps - {f} for f, deps in graph.items()}


def test_no_folder_imports_a_folder_that_imports_it_back():
    """Arrows one way between folders (docs/DESIGN.md, layout): frames below assess and
    diagnosis; manage (the processes) above tuning (the decisions)."""
    graph = folder_graph(ROOT)
    assert {"monitor.frames", "monitor.assess", "monitor.diagnosis"} <= set(graph)
    assert "monitor.frames" in graph["monitor.diagnosis"] and \
        "monitor.tuning" in graph["monitor.manage"]
    assert cycles(graph) == []


def test_the_folder_walk_sees_two_folders_importing_each_other(tmp_path):
    for f, line in (("a/x.py", "from monitor.b import y\n"), ("b/y.py", "import monitor.a.x\n"),
                    ("a/__init__.py", ""), ("b/__init__.py", ""), ("__init__.py", "")):
        (tmp_path / "monitor" / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "monitor" / f).write_text(line)
    assert cycles(folder_graph(tmp_path)) == [["monitor.a", "monitor.b"]]


def test_import_arrows_point_one_way():
    assert violations() == []


def test_the_checker_sees_a_forbidden_arrow(tmp_path, monkeypatch):
    fake = tmp_path / "monitor" / "tuning"
    fake.mkdir(parents=True)
    (fake / "policy.py").write_text("from monitor.store import Store\nimport pandas\n")
    (tmp_path / "workloads").mkdir()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(violations()) == [
        "monitor/tuning/policy.py imports monitor.store (rule monitor/tuning/policy.py)",
        "monitor/tuning/policy.py imports monitor.store.Store (rule monitor/tuning/policy.py)",
        "monitor/tuning/policy.py imports pandas (rule monitor/tuning/policy.py)",
    ]


# (folder, an import its ruff.toml refuses): every folder's rule is in force
FOLDER_RULES = [
    ("monitor/probe", "import pandas"),
    ("monitor/probe", "from monitor.frames import analysis"),
    ("monitor/sampling", "from monitor.ui import charts"),
    ("monitor/store", "import psutil"),
    ("monitor/assess", "from monitor.manage import session"),
    ("monitor/diagnosis", "from monitor.store import Store"),
    ("monitor/diagnosis", "from monitor.assess import window"),
    ("monitor/frames", "from monitor.assess import window"),
    ("monitor/tuning", "from monitor.manage import measure"),
    ("monitor/tuning", "from monitor.ui import charts"),
    ("monitor/export", "from monitor.manage import session"),
    ("monitor/manage", "import streamlit"),
    ("monitor/ui", "import torch"),
    ("monitor/cli", "from monitor.ui import panels"),
    ("monitor", "import pandas"),  # config, records, control, thresholds: the probe's too
]


@pytest.mark.parametrize(("folder", "line"), FOLDER_RULES)
def test_ruff_enforces_each_folder_rule(folder, line, tmp_path):
    """The probe file goes into a copy of the tree's ruff configuration (pyproject.toml and
    every folder's ruff.toml, at their paths), never into the source tree, where another
    test walking monitor/ at the same moment would meet it."""
    for cfg in [ROOT / "pyproject.toml", *ROOT.glob("monitor/**/ruff.toml"),
                *ROOT.glob("workloads/**/ruff.toml")]:
        dest = tmp_path / cfg.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(cfg.read_text())
    bad = tmp_path / folder / "_boundary_probe.py"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text(f"from __future__ import annotations\n\n{line}\n\n__all__ = [\"x\"]\n")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(bad)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "TID251" in r.stdout, r.stdout


def test_every_monitor_folder_has_its_rule():
    folders = {p.parent for p in (ROOT / "monitor").rglob("*.py")}
    missing = [f.relative_to(ROOT).as_posix() for f in folders
               if not any((g / "ruff.toml").exists() for g in (f, *f.parents)
                          if g.is_relative_to(ROOT / "monitor"))]
    assert missing == []
    ruled = {f for f, _ in FOLDER_RULES}
    top = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "monitor").glob("*/ruff.toml")}
    assert top <= ruled, top - ruled


def test_the_design_the_code_cites_is_in_the_repository():
    """Module docstrings and ruff.toml files cite DESIGN.md: a clone can read it."""
    cited = subprocess.run(["git", "grep", "-l", "DESIGN.md"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    assert cited
    design = ROOT / "docs" / "DESIGN.md"
    text = design.read_text()
    for heading in ("## Processes and data flow", "## Layout", "## Definitions"):
        assert heading in text


def test_every_name_a_bench_script_takes_from_the_tests_is_there():
    """The bench scripts reuse test helpers (a served dashboard, Chromium's launch); a helper
    moved or renamed in tests/ breaks a bench that no test runs (bench/first_verdict_page.py
    lost `launch` once). Each `from tests.X import names` in bench/ is resolved here."""
    import importlib
    import importlib.util

    missing = []
    for script in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                module = importlib.import_module(node.module)
                missing += [f"{script.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name)
                            and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert not missing, missing
