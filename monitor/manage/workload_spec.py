"""Checking a user workload spec without importing it here: the dashboard and the CLI never
import torch or user code; a throw-away process does (`python -m workloads.user --check`)."""
from __future__ import annotations

import json
import subprocess
from typing import Any

from monitor.manage import spawn

ENV_VAR = "STARVATION_MONITOR_WORKLOAD"


def check(spec: str, timeout: float = 120.0) -> dict[str, Any]:
    """{"ok": True, "dataset": ..., "defaults": {...}, ...} or {"ok": False, "error": ...}."""
    try:
        r = spawn.run("workloads.user", "--check", spec, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"loading {spec} took longer than {timeout:.0f} s: does "
                                      "its factory download or scan a large dataset?"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()[-8:]
        return {"ok": False, "error": f"checking {spec} crashed (exit {r.returncode}):\n"
                                      + "\n".join(tail)}
    return json.loads(lines[-1])
