"""The live autotune policy: from one measured stretch of a running job to the next loader
setting to try, kept only if it pays more than the measurement's noise. Pure: no store, no
processes (monitor/tuning/live.py drives it from a running job's epochs).

Each observation is one setting's throughput over a stretch (an epoch, or a window of the
managed workload) cut into parts; its noise is the parts' standard error. A move is kept when
the new throughput beats the best so far by more than max(MIN_STEP_GAIN, NOISE_Z x the
combined standard error); otherwise the job goes back to the best setting. Candidates, in
order: the bound model's knee for num_workers (never past the memory budget or the usable
cores' limit), one worker more while the data wait stays high and the cores are not the
limit, prefetch_factor doubled, persistent_workers when epoch starts stall. It settles when
no candidate is left that the model predicts to gain MIN_STEP_GAIN, or after MAX_MOVES.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from monitor.diagnosis.rules import CORES_BOUND, EPOCH_STALL
from monitor.diagnosis.thresholds import MIN_STEP_GAIN, PREFETCH_TRY_SHARE, STARVING_SHARE

MAX_MOVES = 6
NOISE_Z = 2.0
LIVE_KEYS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


@dataclass(frozen=True, slots=True)
class Observation:
    """One setting measured: samples/s over the stretch and its standard error; what the
    diagnosis of the same stretch said (verdict, advised num_workers and its prediction,
    data-wait share, per-worker memory, memory limit)."""

    settings: dict[str, Any]
    throughput: float
    std_error: float | None
    verdict: str
    data_wait_share: float
    advised_workers: int | None = None
    predicted: float | None = None
    worker_memory_mb: float | None = None
    memory_left_mb: float | None = None


@dataclass(frozen=True, slots=True)
class Move:
    settings: dict[str, Any]
    reason: str


@dataclass
class LivePolicy:
    """The state of one job's autotune; `observe` returns the next move, or None."""

    max_workers: int
    max_moves: int = MAX_MOVES
    best: Observation | None = None
    start: Observation | None = None
    moves: list[dict[str, Any]] = field(default_factory=list)
    tried: set = field(default_factory=set)
    settled: str | None = None
    pending: Move | None = None

    def observe(self, obs: Observation) -> Move | None:
        """Judge the stretch just measured, then say what to try next (None: stay)."""
        if self.settled:
            return None
        if self.start is None:
            self.start = self.best = obs
        elif self.pending is not None:
            move = self.pending
            self.pending = None
            if self._beats(obs, self.best):
                self._record(move, obs, kept=True)
                self.best = obs
            else:
                self._record(move, obs, kept=False)
                back = Move(dict(self.best.settings), "back to the best setting: "
                            f"{_desc(move.settings)} did not pay beyond the noise")
                if len(self.moves) >= self.max_moves:
                    return self._settle(back)
                return back  # measured again before the next candidate
        if len(self.moves) >= self.max_moves:
            return self._settle(None, f"after {len(self.moves)} moves")
        cand = self._candidate(self.best)
        if cand is None:
            return self._settle(None, "no candidate is predicted to gain "
                                      f"{MIN_STEP_GAIN:.0%}")
        self.tried.add(_key(cand.settings))
        self.pending = cand
        return cand

    def _beats(self, new: Observation, old: Observation) -> bool:
        errors = [e for e in (new.std_error, old.std_error) if e is not None]
        noise = NOISE_Z * math.sqrt(sum(e * e for e in errors)) if errors else 0.0
        return new.throughput - old.throughput > max(MIN_STEP_GAIN * old.throughput, noise)

    def _candidate(self, b: Observation) -> Move | None:
        s, nw = b.settings, int(b.settings.get("num_workers") or 0)
        options: list[tuple[dict, str]] = []
        if b.advised_workers is not None and b.predicted and \
                b.predicted >= (1 + MIN_STEP_GAIN) * b.throughput:
            options.append(({"num_workers": b.advised_workers}, "the bound model's knee: "
                            f"predicted {b.predicted:,.0f} samples/s"))
        if b.data_wait_share >= STARVING_SHARE and (b.verdict not in CORES_BOUND or nw == 0):
            # from num_workers=0 the main process's own compute counts as busy cores: a
            # worker may still overlap loading with it, and the measurement will say
            options.append(({"num_workers": nw + 1}, f"data wait still "
                            f"{b.data_wait_share:.0%}" + (" and the cores are not the limit"
                                                          if nw else ": try a worker")))
        if nw > 0 and b.data_wait_share > PREFETCH_TRY_SHARE and b.verdict not in CORES_BOUND:
            options.append(({"prefetch_factor": 2 * int(s.get("prefetch_factor") or 2)},
                            "deeper prefetch against jittery loading"))
        if nw > 0 and b.verdict == EPOCH_STALL and not s.get("persistent_workers"):
            options.append(({"persistent_workers": True}, "epoch starts stall"))
        for change, why in options:
            new = {**s, **change}
            n = int(new.get("num_workers") or 0)
            if not 0 <= n <= self.max_workers or _key(new) in self.tried \
                    or _key(new) == _key(s) or not self._fits(b, n):
                continue
            if n == 0:
                new.update(prefetch_factor=None, persistent_workers=False)
            elif new.get("prefetch_factor") is None:
                new["prefetch_factor"] = 2
            return Move(new, why)
        return None

    @staticmethod
    def _fits(b: Observation, workers: int) -> bool:
        """Never a move predicted to exceed the memory left (per-worker memory measured)."""
        extra = (workers - int(b.settings.get("num_workers") or 0)) * (b.worker_memory_mb or 0)
        return b.memory_left_mb is None or extra <= b.memory_left_mb

    def _record(self, move: Move, obs: Observation, kept: bool) -> None:
        self.moves.append({"settings": move.settings, "reason": move.reason,
                           "throughput": obs.throughput, "best_before": self.best.throughput,
                           "kept": kept})

    def _settle(self, last: Move | None, why: str = "") -> Move | None:
        gain = self.best.throughput / self.start.throughput - 1 if self.start.throughput else 0
        self.settled = (f"settled at {_desc(self.best.settings)} after {len(self.moves)} "
                        f"move(s): {self.start.throughput:,.0f} → {self.best.throughput:,.0f}"
                        f" samples/s ({gain:+.0%})" + (f"; {why}" if why else ""))
        return last

    def summary(self) -> dict[str, Any]:
        return {"moves": self.moves, "start": self.start.settings if self.start else None,
                "final": self.best.settings if self.best else None,
                "gain": (self.best.throughput / self.start.throughput - 1)
                if self.start and self.start.throughput else None,
                "settled": self.settled}


def _key(settings: dict[str, Any]) -> tuple:
    return tuple(settings.get(k) for k in LIVE_KEYS)


def _desc(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={settings.get(k)}" for k in LIVE_KEYS
                     if k in ("num_workers", "prefetch_factor") or settings.get(k))
