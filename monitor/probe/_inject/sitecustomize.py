"""Loaded at interpreter start by `python -m monitor run -- ...` (this folder is first on the
script's PYTHONPATH): installs the DataLoader probe's hook (monitor/probe/hook.py), then
runs the environment's own sitecustomize, if there is one, as Python would have."""
import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("STARVATION_MONITOR_RUN_ID"):
    try:  # the probe itself is imported when the script imports a loader (hook.py)
        from monitor.probe.hook import install

        install()
    except Exception as exc:  # the script runs either way
        print(f"starvation-monitor: probe not installed: {exc}", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
