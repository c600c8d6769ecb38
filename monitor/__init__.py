"""Starvation Monitor: shows, per step, whether a GPU is starved by its input pipeline."""
from __future__ import annotations

__version__ = "0.1.0"
