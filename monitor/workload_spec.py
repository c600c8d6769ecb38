"""Checking a user workload spec without importing it here: the dashboard and the CLI never
import torch or user code; a throw-away process does (`python -m workloads.user --check`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "STARVATION_MONITOR_WORKLOAD"


def check(spec: str, timeout: float = 120.0) -> dict[str, Any]:
    """{"ok": True, "dataset": ..., "defaults": {...}, ...} or {"ok": False, "error": ...}."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    try:
        r = subprocess.run([sys.executable, "-m", "workloads.user", "--check", spec],
                           capture_output=True, text=True, timeout=timeout, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"loading {spec} took longer than {timeout:.0f} s: does "
                                      "its factory download or scan a large dataset?"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()[-8:]
        return {"ok": False, "error": f"checking {spec} crashed (exit {r.returncode}):\n"
                                      + "\n".join(tail)}
    return json.loads(lines[-1])
