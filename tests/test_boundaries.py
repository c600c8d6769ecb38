"""DESIGN.md's process boundaries, checked: the dashboard's modules never import torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import sys
import monitor.ui.resources, monitor.ui.panels, monitor.ui.controls, monitor.ui.sweep_panel
import monitor.ui.charts, monitor.diagnosis, monitor.sweep, monitor.jobs, monitor.measure
import monitor.attach, monitor.attached_run, monitor.__main__
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_dashboard_process_never_imports_torch():
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_app_script_imports_no_torch_directly():
    src = (ROOT / "app.py").read_text()
    assert "import torch" not in src and "from torch" not in src
