"""Live autotune of a running job (`monitor run --autotune`): each rank's completed epochs
are measured from the store, the policy (policy.py) picks the next loader setting, and the
request goes through the control path the probe already applies at the next iter(loader).
Epochs shorter than MIN_STEPS steps are pooled until there are enough; a change counts only
from the first epoch that ran entirely under it.
"""
from __future__ import annotations

import statistics
import threading
from typing import TYPE_CHECKING, Any

from monitor.assess import Context, Window, assess
from monitor.tuning.policy import LIVE_KEYS, LivePolicy, Move, Observation

if TYPE_CHECKING:
    import pandas as pd

    from monitor.store import Store

MIN_STEPS = 20  # a stretch shorter than this is pooled with the next epoch's
PARTS = 5  # the stretch is cut into this many parts for its noise


class RankTuner:
    """One rank's policy and what it has seen."""

    def __init__(self, rank: int, max_workers: int) -> None:
        self.rank, self.policy = rank, LivePolicy(max_workers)
        self.used_epochs: set[int] = set()
        self.wait_seq: int | None = None  # the config generation a request will bring
        self.announced = False  # the settled line recorded

    def ready(self, steps: pd.DataFrame) -> pd.DataFrame | None:
        """Completed epochs of the current generation not yet used, once they hold
        MIN_STEPS steps (an epoch is complete when a later one has begun)."""
        if steps.empty:
            return None
        seq = int(steps["config_seq"].max())
        if self.wait_seq is not None and seq < self.wait_seq:
            return None
        last = int(steps["epoch"].max())
        mine = steps[(steps["config_seq"] == seq) & (steps["epoch"] < last)
                     & ~steps["epoch"].isin(self.used_epochs)]
        pure = [e for e, g in mine.groupby("epoch")
                if len(g) == len(steps[steps["epoch"] == e])]  # the whole epoch under seq
        chosen = mine[mine["epoch"].isin(pure)]
        return chosen if len(chosen) >= MIN_STEPS else None


def observation(window: Window, steps: pd.DataFrame, ctx: Context,
                settings: dict[str, Any]) -> Observation:
    """The policy's view of a stretch: its assessment, cut into parts for the noise."""
    a = assess(window, ctx, parts=PARTS)
    w = list(a.window_throughputs)
    se = statistics.stdev(w) / len(w) ** 0.5 if len(w) >= 2 else None
    f = a.features
    advice = next((x for x in a.diagnosis.advice if x.param == "num_workers"), None)
    left = None
    if f.mem_available_mb is not None:
        left = 0.85 * f.mem_available_mb
    return Observation(settings, f.throughput, se, a.verdict, f.data_wait_share,
                       advice.value if advice else None,
                       advice.predicted_throughput if advice else None,
                       f.worker_uss_mb or f.worker_rss_mb, left)


class LiveTuner:
    """Drives one LivePolicy per rank from a named daemon thread until stop()."""

    def __init__(self, store: Store, run_id: int, ctx: Context, interval: float = 1.0) -> None:
        self.store, self.run_id, self.ctx, self.interval = store, run_id, ctx, interval
        self.ranks: dict[int, RankTuner] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="starvation-autotune",
                                        daemon=True)
        self.errors: list[str] = []

    def start(self) -> LiveTuner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception as exc:  # the job goes on; the note says why tuning stopped
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return
        self.store.close()

    def step(self) -> None:
        run = self.store.run(self.run_id) or {}
        info = self.store.ranks(self.run_id)
        world = max(1, len(info))
        steps = self.store.steps(self.run_id)
        for _, row in info.iterrows():
            r = int(row["rank"])
            tuner = self.ranks.setdefault(r, RankTuner(r, max(1, self.ctx.max_workers
                                                                  // world)))
            mine = steps[steps["rank"] == r] if "rank" in steps.columns else steps
            chosen = tuner.ready(mine)
            if chosen is None:
                continue
            tuner.used_epochs |= set(int(e) for e in chosen["epoch"].unique())
            settings = {k: (row["config"] or {}).get(k) for k in LIVE_KEYS}
            host = self.store.host_samples(float(chosen["ts"].min()), float(chosen["ts"].max()))
            if "rank" in host.columns and world > 1:
                host = host[host["rank"] == r]
            window = Window({**run, "config": row["config"] or {}}, chosen, host)
            move = tuner.policy.observe(observation(window, chosen, self.ctx, settings))
            if move is not None:
                self._request(tuner, r, move, int(mine["config_seq"].max()), world)
            elif tuner.policy.settled and not tuner.announced:
                tuner.announced = True
                self.store.add_event(self.run_id, "autotune", tuner.policy.settled,
                                     {"rank": r})

    def _request(self, tuner: RankTuner, rank: int, move: Move, seq: int, world: int) -> None:
        payload = {k: move.settings.get(k) for k in LIVE_KEYS}
        if world > 1:
            payload["rank"] = rank
        self.store.request_control(self.run_id, "config", payload)
        self.store.add_event(self.run_id, "autotune", move.reason, {**payload, "rank": rank})
        tuner.wait_seq = seq + 1

    def summary(self) -> dict[str, Any]:
        per = {r: t.policy.summary() for r, t in sorted(self.ranks.items())}
        out = per.get(0, {"moves": [], "start": None, "final": None, "gain": None,
                          "settled": None})
        if len(per) > 1:
            out = {**out, "ranks": per}
        if self.errors:
            out["error"] = self.errors[-1]
        return out
