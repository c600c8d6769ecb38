"""The probe's first hold in the script's interpreter, installed by `monitor run`'s
sitecustomize (monitor/probe/_inject): a finder that waits for the script to import one of
the loader modules the probe times, and only then imports the probe (monitor/probe/patch.py:
the recorder, the store, ~130 ms) and hands it that import. The script's first line runs
that much sooner, and a script that never imports a loader never pays for the probe.
Standard library only, and nothing of monitor's: it is imported at every interpreter start.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any

# the modules monitor/probe/patch.py patches (its TARGETS; tests/test_attach.py checks both)
MODULES = (
    "torch.utils.data.dataloader",
    "webdataset.compat",
    "lightning.pytorch.utilities.combined_loader",
    "pytorch_lightning.utilities.combined_loader",
    "torchdata.nodes.loader",
    "fastai.data.load",
)


class _Waiting(importlib.abc.MetaPathFinder):
    """Until a MODULES module is imported: then the probe, installed, finds it."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in MODULES:
            return None
        with_probe = _probe()
        return with_probe.find_spec(name, path, target) if with_probe is not None else None


def _probe() -> Any:
    """The probe installed in this hook's place; its finder (None: it could not be)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Waiting)]
    try:
        from monitor.probe import patch

        patch.install()
        return patch.finder()
    except Exception as exc:  # the script runs either way
        print(f"starvation-monitor: probe not installed: {exc}", file=sys.stderr)
        return None


def install() -> None:
    """Wait for a loader module, or install the probe now if one is imported already."""
    if any(name in sys.modules for name in MODULES):
        _probe()
    elif not any(isinstance(f, _Waiting) for f in sys.meta_path):
        sys.meta_path.insert(0, _Waiting())
