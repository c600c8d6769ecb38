"""The one tuning policy, shared by `monitor tune` (each setting a fresh run, search.py) and the
live autotuner (each setting a stretch of a running job, live.py): from one measured setting
to the next one to try, kept only if it pays more than the measurement's noise. Pure: no
store, no processes.

Each observation is one setting's throughput over a stretch (a run's steady window, an epoch,
N steps, or a window of the managed workload) cut into parts; its noise is the parts'
standard error, SE = stdev(parts) / sqrt(parts). A move is kept when the new throughput beats
the best so far by more than max(MIN_STEP_GAIN, NOISE_Z x sqrt(SE_new² + SE_best²));
otherwise the job goes back to the best setting (a fresh-run search simply measures from the
best again). A move whose stretch failed (workers killed, out of memory) is reverted with
its reason. A move measured while other processes took HOST_BUSIER_CORES more (or less) CPU
than when the best was measured is not judged on it: the best is measured again under the
move's load, and the two are compared head to head (each move's record keeps both loads).

Candidates, in order, from the best setting so far. The first two are the diagnosis's own
advice (one advice engine: the page's Apply buttons and the tuner try the same moves); the
policy decides only when to move and when to go back:
1. the bound model's knee for num_workers (monitor/diagnosis/bound.py, searched up to
   max_workers: 3x the usable cores, since storage-latency-bound loaders keep gaining past
   the core count, which the model's io term says);
2. the diagnosis's other loader advice that buys speed (Observation.advice, loader_advice):
   a deeper prefetch (tail stalls), persistent_workers (epoch stalls, start-up),
   pin_memory (the copy shows), in_order=False (head-of-line); a memory relief (prefetch 1,
   pin_memory off) trades speed for room and is never searched;
3. the search's own step, where those are spent: from num_workers=0, a loader per usable
   core, persistent (one worker alone only overlaps loading with the compute, a gain of at
   most the compute's share; workers restarted each epoch pay their start-up each epoch);
   else one worker more while the data wait could still pay MIN_STEP_GAIN (removing a
   share s of waiting gains at most s / (1 - s)) and the cores are not the limit (or the
   last move's measured gain says the climb still pays, whatever the model thought).
A job found healthy at its first stretch is left alone. Never a move past max_workers or
predicted (per-worker memory measured) to exceed the memory left. It settles when no
candidate is left that is predicted to gain MIN_STEP_GAIN, or after max_moves, and says so
in one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monitor.config import LIVE_SETTINGS, normalise, prefetch_of, settings_label
from monitor.diagnosis.rules import CORES_BOUND, HEALTHY
from monitor.thresholds import (
    HOST_BUSIER_CORES,
    MEMORY_HEADROOM,
    MIN_STEP_GAIN,
    NOISE_Z,
    noise_band,
)

MAX_MOVES = 6


@dataclass(frozen=True, slots=True)
class Observation:
    """One setting measured: samples/s over the stretch and its standard error; what the
    diagnosis of the same stretch said (verdict, advised num_workers and its prediction,
    data-wait share, per-worker memory, memory left); `failed` says why nothing usable came
    through (the stretch's run failed, workers were killed)."""

    settings: dict[str, Any]
    throughput: float
    std_error: float | None
    verdict: str
    data_wait_share: float
    advised_workers: int | None = None
    predicted: float | None = None
    worker_memory_mb: float | None = None
    memory_left_mb: float | None = None
    failed: str | None = None
    cuda: bool = False
    cores: int | None = None  # usable cores (affinity, cgroup quota)
    other_cores: float | None = None  # other processes' CPU while it was measured
    advised_limit: str | None = None  # the bound model's limit at the advised setting
    # the diagnosis's other loader advice, in its order: (param, value, predicted, reason)
    advice: tuple[tuple[str, Any, float | None, str], ...] = ()


# the advice the tuner can judge by throughput: the direction that buys speed (a memory
# relief, prefetch 1 or pin_memory off, trades speed for room: the user's call, not a search's)
SPEED = {"prefetch_factor": lambda s, new: new > prefetch_of(s),
         "pin_memory": lambda s, new: new is True, "persistent_workers": lambda s, new: new
         is True, "in_order": lambda s, new: new is False}


def loader_advice(items: Any) -> tuple[tuple[str, Any, float | None, str], ...]:
    """The diagnosis's advice on the loader settings other than num_workers (Advice objects
    or their dicts), for Observation.advice."""
    out = []
    for a in items or ():
        d = a if isinstance(a, dict) else a.to_dict()
        if d.get("param") in SPEED:
            out.append((d["param"], d["value"], d.get("predicted_throughput"),
                        str(d.get("reason") or "")))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Move:
    settings: dict[str, Any]
    reason: str
    revert: bool = False  # back to the best setting, already measured
    extend: bool = False  # the same setting measured once more (nothing to apply)
    remeasure: bool = False  # back to the best, to be measured again (not a known result)
    predicted: float | None = None  # the bound model's samples/s for it, when it has one
    limit: str | None = None  # the bound model's limit at it, with the prediction


def memory_left_mb(available_mb: float | None, used_mb: float | None,
                   budget_mb: float | None) -> float | None:
    """What a move may add: the budget (the diagnosis's one resolver) less what the workload
    uses, else MEMORY_HEADROOM of the machine's available memory; None when unknown."""
    if budget_mb is not None:
        return max(0.0, budget_mb - (used_mb or 0.0))
    return None if available_mb is None else MEMORY_HEADROOM * available_mb


@dataclass
class Policy:
    """The state of one search; `observe` returns the next move, or None (settled)."""

    max_workers: int
    max_moves: int = MAX_MOVES
    unit: str = "stretch"  # what one observation is, for the settled line: epoch, run, ...
    best: Observation | None = None
    start: Observation | None = None
    moves: list[dict[str, Any]] = field(default_factory=list)
    tried: set = field(default_factory=set)
    settled: str | None = None
    pending: Move | None = None
    partial: Observation | None = None  # a promising move's first measurement
    rematch: tuple[Move, Observation] | None = None  # a move measured under another load
    extensions: int = 0  # measurements taken once more
    rematches: int = 0  # the best measured again under a move's host load
    reverted: list[Observation] = field(default_factory=list)  # moves measured not to pay
    observed: int = 0
    _predicted: dict = field(default_factory=dict)  # settings key -> (samples/s, limit)

    def observe(self, obs: Observation, measured: bool = True) -> Move | None:
        """Judge the stretch just measured, then say what to try next (None: stay).
        `measured` False: an observation fed again, not a new stretch (a fresh-run search
        going back to its best), left out of the count."""
        if self.settled:
            return None
        self.observed += measured
        if self.start is None:
            self.start = self.best = obs
            self.tried.add(_key(obs.settings))
            if obs.verdict == HEALTHY:  # a fed device: a healthy job is left alone
                return self._settle(None, "the loader keeps the device fed")
        elif self.rematch is not None:  # the best, measured again under the move's load
            (move, moved), self.rematch = self.rematch, None
            if self.start is self.best:  # where it began, under the load now: the gain's base
                self.start = obs
            self.best = obs
            kept = self._beats(moved, obs)
            self._record(move, moved, kept)
            if kept:
                self.best = moved
                return Move(dict(moved.settings), f"{describe_settings(moved.settings)} "
                            "beat the best measured again under the same host load: back to "
                            "it", revert=True)
        elif self.pending is not None:
            if self.unfair(obs):  # the host changed between the two: measure the best again
                self.rematch, self.pending = (self.pending, obs), None
                self.rematches += 1
                return Move(dict(self.best.settings), "the host's other load changed "
                            f"({obs.other_cores:.1f} vs {self.best.other_cores:.1f} cores "
                            "of other processes): the best setting measured again under it",
                            revert=True, remeasure=True)
            if self.partial is not None:  # the second measurement of a promising move
                obs, self.partial = _pooled(self.partial, obs), None
            elif obs.failed is None and not self._beats(obs, self.best) and \
                    obs.throughput >= (1 + MIN_STEP_GAIN) * self.best.throughput:
                self.partial = obs  # a gain the noise hides: measure it once more
                self.extensions += 1
                gain = obs.throughput / self.best.throughput - 1
                return Move(dict(obs.settings), f"{gain:+.0%} but within the noise: "
                            "measured once more", extend=True)
            move, self.pending = self.pending, None
            kept = obs.failed is None and self._beats(obs, self.best)
            self._record(move, obs, kept)
            if kept:
                self.best = obs
            else:
                why = (f"{describe_settings(move.settings)} failed: {obs.failed}" if obs.failed else
                       f"{describe_settings(move.settings)} did not pay beyond the noise")
                back = Move(dict(self.best.settings), f"back to the best setting: {why}",
                            revert=True)
                if len(self.moves) >= self.max_moves:
                    return self._settle(back, f"after {len(self.moves)} moves")
                self.reverted.append(obs)
                return back  # measured again (live) before the next candidate
        elif measured and obs.failed is None and _key(obs.settings) == _key(self.best.settings):
            back = self._remeasured(obs)  # the best measured again, after a move reverted
            if back is not None:
                return back
        if len(self.moves) >= self.max_moves:
            return self._settle(None, f"after {len(self.moves)} moves")
        cand = self._candidate(self.best)
        if cand is None:
            return self._settle(None, "no candidate is predicted to gain "
                                      f"{MIN_STEP_GAIN:.0%}")
        self.tried.add(_key(cand.settings))
        self.pending = cand
        return cand

    def _remeasured(self, obs: Observation) -> Move | None:
        """The best setting measured again (the stretch after going back to it): pooled
        with its earlier reading, or in its place when the two differ beyond their noise or
        the host's other load changed between them (the host is slower or faster now, or
        the first reading was lucky), so one reading does not stand against every move. A
        move reverted against the old reading that beats the new one is gone back to."""
        old = self.best
        changed = self.unfair(obs) or self._beats(old, obs) or self._beats(obs, old)
        self.best = obs if changed else _pooled(old, obs)
        if self.start is old:
            self.start = self.best
        rivals = [o for o in self.reverted if self._beats(o, self.best)
                  and not self._unfair_pair(o, self.best)]
        if not rivals:
            return None
        won = max(rivals, key=lambda o: o.throughput)
        self.reverted.remove(won)
        predicted, limit = self._predicted.get(_key(won.settings), (None, None))
        self._record(Move(dict(won.settings), "re-judged against the best measured again",
                          predicted=predicted, limit=limit), won, True)
        self.best = won
        return Move(dict(won.settings), f"{describe_settings(won.settings)} beat the best "
                    "setting measured again: back to it", revert=True)

    @staticmethod
    def _unfair_pair(a: Observation, b: Observation) -> bool:
        return a.other_cores is not None and b.other_cores is not None and \
            abs(a.other_cores - b.other_cores) >= HOST_BUSIER_CORES

    def unfair(self, obs: Observation) -> bool:
        """Whether the best and this move were measured under different host loads (by
        HOST_BUSIER_CORES of other processes' CPU): their throughputs do not compare."""
        return obs.failed is None and self.best is not None and \
            self._unfair_pair(obs, self.best)

    def _beats(self, new: Observation, old: Observation) -> bool:
        noise = noise_band([new.std_error, old.std_error])
        return new.throughput - old.throughput > max(MIN_STEP_GAIN * old.throughput, noise)

    def _options(self, b: Observation) -> list[tuple[dict, str]]:
        s, nw = b.settings, int(b.settings.get("num_workers") or 0)
        # the model says the cores are full; a measured gain from the last move says the
        # climb still pays (a CPU-bound step's threads lose CPU to more loaders): one more
        cores_bound = b.verdict in CORES_BOUND and not (self.moves and self.moves[-1]["kept"])
        out: list[tuple[dict, str]] = []
        if b.advised_workers is not None and b.predicted and \
                b.predicted >= (1 + MIN_STEP_GAIN) * b.throughput and \
                (b.advised_workers > nw or cores_bound):  # fewer: only off oversubscription
            out.append(({"num_workers": b.advised_workers}, "the bound model's knee: "
                         f"predicted {b.predicted:,.0f} samples/s"))
            self._predicted[_key(normalise({**s, "num_workers": b.advised_workers}))] = \
                (b.predicted, b.advised_limit)
        # then the diagnosis's other advice (rules.py, causes.py), not decided again here:
        # the moves that buy speed, each once
        for param, value, pred, why in b.advice:
            if SPEED[param](s, value) and (nw > 0 or param == "pin_memory"):
                out.append(({param: value}, f"the diagnosis: {why}" if why else param))
                if pred:
                    self._predicted[_key(normalise({**s, param: value}))] = (pred, None)
        # last, the search's own steps, where the diagnosis names none that is left: what
        # removing the whole data wait would give: share / (1 - share)
        room = b.data_wait_share / max(1e-9, 1 - b.data_wait_share)
        if room >= MIN_STEP_GAIN and nw == 0:
            # one worker only overlaps loading with the compute (a gain of at most the
            # compute's share): start with a loader per usable core
            n = max(1, min(self.max_workers, b.cores or 1))
            out.append(({"num_workers": n}, f"data wait {b.data_wait_share:.0%}: "
                         f"a loader per usable core ({n})"))
        elif room >= MIN_STEP_GAIN and not cores_bound:
            out.append(({"num_workers": nw + 1}, f"data wait still {b.data_wait_share:.0%}"
                         " and the cores are not the limit"))
        return out

    def _candidate(self, b: Observation) -> Move | None:
        s = b.settings
        for change, why in self._options(b):
            predicted, limit = self._predicted.get(_key(normalise({**s, **change})),
                                                   (None, None))
            if not s.get("num_workers") and change.get("num_workers"):
                # workers from none: kept alive between epochs, or each epoch pays their
                # start-up, which on short epochs (Lightning's defaults) eats their gain;
                # once that was measured not to pay, the same workers restarted each epoch
                # (with Lightning's validation, kept workers cost a 96-batch epoch ~15%)
                kept = {**change, "persistent_workers": True}
                if _key(normalise({**s, **kept})) not in self.tried:
                    change, why = kept, f"{why}; kept between epochs"
                else:
                    why = f"{why}; restarted each epoch (kept between epochs did not pay)"
            new = normalise({**s, **change})
            n = int(new.get("num_workers") or 0)
            if not 0 <= n <= self.max_workers or _key(new) in self.tried \
                    or not self._fits(b, n):
                continue
            if predicted is not None:
                self._predicted[_key(new)] = (predicted, limit)
            return Move(new, why, predicted=predicted, limit=limit)
        return None

    @staticmethod
    def _fits(b: Observation, workers: int) -> bool:
        """Never a move predicted to exceed the memory left (per-worker memory measured)."""
        extra = (workers - int(b.settings.get("num_workers") or 0)) * (b.worker_memory_mb or 0)
        return b.memory_left_mb is None or extra <= b.memory_left_mb

    def _record(self, move: Move, obs: Observation, kept: bool) -> None:
        best = self.best.throughput
        noise = noise_band([obs.std_error, self.best.std_error]) / best if best else None
        self.moves.append({"settings": move.settings, "reason": move.reason,
                           "predicted": move.predicted,
                           "throughput": obs.throughput, "best_before": best,
                           "kept": kept, "failed": obs.failed, "noise": noise,
                           "other_cores": obs.other_cores,
                           "other_cores_before": self.best.other_cores})

    def _settle(self, last: Move | None, why: str = "") -> Move | None:
        gain = self.best.throughput / self.start.throughput - 1 if self.start.throughput else 0
        n = self.observed
        self.settled = (f"settled at {describe_settings(self.best.settings)} after {n} {self.unit}"
                        f"{'s' if n != 1 else ''}: {self.start.throughput:,.0f} → "
                        f"{self.best.throughput:,.0f} samples/s ({gain:+.0%})"
                        + (f"; {why}" if why else ""))
        return last

    def summary(self) -> dict[str, Any]:
        return {"moves": self.moves, "start": self.start.settings if self.start else None,
                "final": self.best.settings if self.best else None,
                "start_throughput": self.start.throughput if self.start else None,
                "final_throughput": self.best.throughput if self.best else None,
                "gain": (self.best.throughput / self.start.throughput - 1)
                if self.start and self.start.throughput else None,
                "observed": self.observed, "extensions": self.extensions,
                "settled": self.settled,
                "trying": self.pending.settings if self.pending else None}


def outcome(m: dict[str, Any]) -> str:
    """What a judged move measured, in words: 'kept', 'worse, reverted', 'within the noise
    ±4%, reverted', 'below the 3% a move must gain, reverted', 'failed: why'."""
    if m.get("kept"):
        return "kept"
    if m.get("failed"):
        return f"failed: {m['failed']}"
    gain = m["throughput"] / m["best_before"] - 1 if m.get("best_before") else 0.0
    noise = m.get("noise") or 0.0
    if abs(gain) <= noise:
        return f"within the noise ±{noise:.0%}, reverted"
    if gain < 0:
        return "worse, reverted"
    return f"below the {MIN_STEP_GAIN:.0%} a move must gain, reverted"


def host_note(m: dict[str, Any]) -> str:
    """'; host: other processes 1.1 vs 0.1 cores' for a judged move, when both are known."""
    a, b = m.get("other_cores"), m.get("other_cores_before")
    return f"; host: other processes {a:.1f} vs {b:.1f} cores" if a is not None and \
        b is not None else ""


def _pooled(a: Observation, b: Observation) -> Observation:
    """Two measurements of one setting as one: their mean, and the larger of their combined
    standard error and the one their difference shows."""
    se = max(noise_band([a.std_error, b.std_error]) / NOISE_Z / 2,
             abs(a.throughput - b.throughput) / 2)
    return Observation(**{**{f: getattr(b, f) for f in Observation.__dataclass_fields__},
                          "throughput": (a.throughput + b.throughput) / 2, "std_error": se})


def _key(settings: dict[str, Any]) -> tuple:
    return tuple(settings.get(k) for k in LIVE_SETTINGS)


def describe_settings(settings: dict[str, Any]) -> str:
    """A move's settings as one label (config.settings_label): 'num_workers=2,
    prefetch_factor=2', plus each switch away from its default."""
    return settings_label(settings)
