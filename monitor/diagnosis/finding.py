"""A finding: a cause named from the window's evidence, with its numbers and its fix."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from monitor.diagnosis.rules import Advice


@dataclass(frozen=True, slots=True)
class Finding:
    cause: str
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)
    advice: tuple[Advice, ...] = ()
    no_more_workers: bool = False  # more workers would not help (or would make it worse)
    leads: bool = False  # its sentence opens the headline, before the verdict's reasoning

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["advice"] = [a.to_dict() for a in self.advice]
        return d
