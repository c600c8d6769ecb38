"""The diagnosis's records: an Advice (a setting, its predicted gain and its base), a Finding
(a cause named from the window's evidence, with its numbers and its fix), the Diagnosis."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Advice:
    param: str  # a LoaderConfig field, or "dataset"/"host" for changes outside the loader
    value: Any
    predicted_throughput: float | None
    reason: str
    limit: str | None = None  # the bound model's limit at the advised setting
    # the range the window's evidence supports (the others' demand at its p90 and p10 while
    # it was measured), and whether it spans no gain: then the advice cannot promise one
    predicted_low: float | None = None
    predicted_high: float | None = None
    uncertain: bool = False
    # what its percentage is of: the window's throughput, less the monitor's own cost where
    # it was separated (bound.py, BoundModel.bare_factor); None where no gain is predicted
    base_throughput: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """`verdict` is the family (VERDICTS: healthy, starving, cpu-bound, ...); `cause` the
    finding that explains it where one holds (monitor/diagnosis/causes.py CAUSES), which the
    JSON, the banner, Prometheus and the gate report as the verdict (DESIGN.md: verdict)."""

    verdict: str
    headline: str
    bound: dict[str, Any]
    advice: tuple[Advice, ...] = ()
    cause: str | None = None

    @property
    def named(self) -> str:
        """What `verdict` says outside: the cause where a finding holds, else the family."""
        return self.cause or self.verdict


@dataclass(frozen=True, slots=True)
class Finding:
    cause: str
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)
    advice: tuple[Advice, ...] = ()
    no_more_workers: bool = False  # more workers would not help (or would make it worse)
    leads: bool = False  # its sentence opens the headline, before the verdict's reasoning
    # its cause is in the CPU figures the bound model predicts other num_workers from (a
    # pool's threads spinning: NOTE [threads at work]): no num_workers change is advised
    # beside it; its own fix first, and the next window predicts from figures without it
    workers_unpredictable: bool = False
    # the causes this finding explains, left out beside it (causes.find): the main process's
    # pool, where its loop's thread receives slowly for want of a CPU, is the loop-receive
    supersedes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["advice"] = [a.to_dict() for a in self.advice]
        del d["supersedes"]  # how findings are chosen, not what one says
        return d
