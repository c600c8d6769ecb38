"""torch.compile's (re)compiles, read from the script's own dynamo at no per-step cost: its
graph counter (`counters["stats"]["unique_graphs"]`) and the guard failures that made it
compile again (`guard_failures`: "tensor 'args[0]' size mismatch at index 1. expected 10,
actual 12"), looked at when an epoch of the timed loader starts and when the process ends,
never on the step's path. Dynamo is read from sys.modules: a script that never compiles
never pays a look.

What changed since the last look is one `compile` event: the graphs new since then, the
reasons (the newest cache entry's first, per new graph), whether a frame hit dynamo's
recompile_limit (after which its new shapes run uncompiled, with a warning torch prints
once), and the probe's step then (all of it happened in the steps since the last look), for
the recompiles finding (monitor/diagnosis/compiles.py)."""
from __future__ import annotations

import sys
from typing import Any

REASONS_KEPT = 20


LIMIT = "recompile limit exceeded"  # dynamo's Unsupported, counted in counters["unimplemented"]


def read() -> tuple[int, dict[int, list[Any]], int] | None:
    """(graphs compiled, each compiled frame's guard failures, the times a frame hit
    dynamo's recompile_limit: from then on its new shapes run uncompiled), or None where
    dynamo was never imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    graphs = int(utils.counters["stats"].get("unique_graphs", 0))
    failures = {id(code): list(reasons) for code, reasons in list(utils.guard_failures.items())}
    limit = sum(int(n) for msg, n in list(utils.counters["unimplemented"].items())
                if LIMIT in str(msg).lower())
    return graphs, failures, limit


class CompileWatch:
    """What dynamo compiled since the last look, as one event's data (None: nothing new)."""

    def __init__(self) -> None:
        self.graphs = self.limit = 0
        self.seen: dict[int, int] = {}  # frame -> guard failures already reported

    def look(self, step: int) -> dict[str, Any] | None:
        got = read()
        if got is None:
            return None
        graphs, failures, limit = got
        new = [str(r) for code, reasons in failures.items()  # (only the new ones as text)
               for r in reasons[self.seen.get(code, 0):]]
        self.seen = {code: len(reasons) for code, reasons in failures.items()}
        hit, self.limit = limit > self.limit, max(self.limit, limit)
        if graphs <= self.graphs and not hit:
            return None
        # a recompile fails the guards of the frame's first graph ("F/0: ..."); a frame's
        # first compile is none (and the attempt past dynamo's recompile_limit compiles none)
        first = 1 if self.graphs == 0 else 0
        data = {"graphs": graphs, "new_graphs": max(0, graphs - self.graphs), "step": step,
                "recompiles": max(0, min(sum(1 for r in new if "/0:" in r),
                                         graphs - self.graphs - first)),
                "reasons": new[:REASONS_KEPT], "limit_hit": hit}
        self.graphs = graphs
        return data
