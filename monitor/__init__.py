"""Starvation Monitor: shows, per step, whether a GPU is starved by its input pipeline."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def watch(loader: Any, name: str | None = None) -> Any:
    """`for batch in watch(loader): ...` records this epoch's data wait and compute per step
    to the store (see monitor.probe.patch)."""
    from monitor.probe.patch import watch as _watch

    return _watch(loader, name)


def lightning_callback(name: str | None = None) -> Any:
    """A Lightning Callback recording the fit loop's steps (monitor.probe.frameworks)."""
    from monitor.probe.frameworks import lightning_callback as make

    return make(name)


def hf_callback(name: str | None = None) -> Any:
    """A Hugging Face TrainerCallback recording the Trainer's steps (monitor.probe.frameworks)."""
    from monitor.probe.frameworks import hf_callback as make

    return make(name)


def fastai_callback(name: str | None = None) -> Any:
    """A fastai Callback recording Learner.fit's steps (monitor.probe.frameworks)."""
    from monitor.probe.frameworks import fastai_callback as make

    return make(name)
