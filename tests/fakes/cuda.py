"""torch's CUDA as the probe reads it, on a machine without CUDA."""
from __future__ import annotations

import contextlib
import sys
import types


@contextlib.contextmanager
def fake_torch(**cuda: object):
    """sys.modules["torch"] replaced, for the probe's reads of a script's torch, by a stand-in
    whose `torch.cuda` has the given callables (CUDA is hardware this machine lacks)."""
    old = sys.modules.get("torch")
    sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(**cuda))
    try:
        yield
    finally:
        if old is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = old
