"""DESIGN.md's process and layer boundaries, checked: the dashboard's modules never import
torch, and the import arrows between layers point one way (probe / collector -> store ->
assess -> ui, CLI and exporter). ruff enforces the folder-level rules (monitor/*/ruff.toml);
this test holds the file-level ones and asserts ruff's rules are in force."""
from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import sys
import monitor.ui.resources, monitor.ui.panels, monitor.ui.controls, monitor.ui.sweep_panel
import monitor.ui.charts, monitor.diagnosis, monitor.tuning.search, monitor.tuning.jobs
import monitor.tuning.experiment, monitor.measure, monitor.assess, monitor.runtime
import monitor.attach, monitor.attached_run, monitor.__main__
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""

PURE = ["monitor.session", "monitor.measure", "monitor.ui", "monitor.runtime",
        "monitor.collector", "monitor.tuning.experiment", "monitor.tuning.jobs",
        "psutil", "subprocess", "multiprocessing", "streamlit", "torch", "workloads"]
# (files, module prefixes they may not import)
FORBIDDEN = [
    ("monitor/*", ["torch", "workloads"]),
    ("monitor/analysis.py", PURE + ["monitor.store", "monitor.assess", "monitor.diagnosis",
                                    "monitor.host"]),
    ("monitor/diagnosis/*", PURE + ["monitor.store", "monitor.assess", "monitor.host",
                                    "monitor.tuning"]),
    ("monitor/assess.py", [m for m in PURE if m != "psutil"] + ["monitor.tuning"]),
    ("monitor/tuning/search.py", PURE + ["monitor.store", "monitor.host", "monitor.assess"]),
    ("monitor/tuning/policy.py", PURE + ["monitor.store", "monitor.host", "monitor.assess",
                                        "pandas"]),
    # in the user's script beside the probe: the standard library only
    ("monitor/identity.py", ["monitor.", "pandas", "psutil"]),
    ("monitor/timed.py", ["monitor.store", "monitor.assess", "pandas", "psutil"]),
    ("monitor/records.py", ["monitor.", "pandas", "psutil"]),
    ("monitor/config.py", ["monitor.host", "monitor.store", "psutil", "pandas"]),
    ("monitor/store/*", ["monitor.session", "monitor.assess", "monitor.ui", "psutil"]),
    ("monitor/probe.py", ["monitor.session", "monitor.assess", "monitor.ui", "pandas"]),
    ("workloads/*", ["monitor.ui", "monitor.session", "monitor.runtime", "streamlit",
                     "pynvml"]),
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
                if any(m == b or m.startswith(b if b.endswith(".") else b + ".")
                       for b in banned):
                    bad.append(f"{rel} imports {m} (rule {pattern})")
    return bad


def test_dashboard_process_never_imports_torch():
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_app_script_imports_no_torch_directly():
    assert not {m for m in imports(ROOT / "app.py") if m.split(".")[0] == "torch"}


def test_import_arrows_point_one_way():
    assert violations() == []


def test_the_checker_sees_a_forbidden_arrow(tmp_path, monkeypatch):
    fake = tmp_path / "monitor" / "diagnosis"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text("from monitor import session\nimport psutil\n")
    (tmp_path / "workloads").mkdir()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(violations()) == [
        "monitor/diagnosis/x.py imports monitor.session (rule monitor/diagnosis/*)",
        "monitor/diagnosis/x.py imports psutil (rule monitor/diagnosis/*)",
    ]


def test_ruff_enforces_the_layers(tmp_path):
    """A copy of the diagnosis layer with a forbidden import fails `ruff check`."""
    bad = ROOT / "monitor" / "diagnosis" / "_boundary_probe.py"
    bad.write_text("from __future__ import annotations\n\nfrom monitor import session\n\n"
                   "__all__ = [\"session\"]\n")
    try:
        r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(bad)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        bad.unlink()
    assert r.returncode == 1 and "TID251" in r.stdout and "monitor.session" in r.stdout
