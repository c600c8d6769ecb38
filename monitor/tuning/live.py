"""Live autotune of a running job: `monitor run --autotune` and the page's Auto-tune switch.

Each rank's steps are read from the store as they come (only the new ones each second), cut
into stretches of one loader setting, and each stretch is judged by the one policy
(policy.py, shared with `monitor tune`). Its next setting goes through the control path the
job already obeys: an attached script's probe applies it at its next iter(loader) (or at a
step boundary with --autotune-every-steps), the managed workload rebuilds its loader between
two steps. A stretch (Cadence) is:
- "epoch": the completed epochs run entirely under the current setting, pooled until they
  hold AUTOTUNE_MIN_STEPS steps (short epochs), each epoch's start-up included since it is paid
  every epoch; with persistent workers the setting's first epoch is left out (its workers'
  start, paid once: on Lightning's 12-batch epochs of half a second it was a third of the
  stretch and made 2 workers read slower than none);
- "steps": N steps under the current setting, after skipping its start-up transient (the
  new workers' start and first fill: the batches in flight, or a tenth of N), paid once;
- "window": the managed workload's measurement window, WINDOW_S seconds under the current
  setting after its warm-up.
Ranks of a job are tuned apart, each within its share of the host's worker budget.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from monitor import control, thresholds
from monitor.assess.follow import Follower
from monitor.assess.window import Context, Window, assess
from monitor.config import LIVE_SETTINGS, in_flight
from monitor.frames.analysis import loop_rate, rank_rows, run_rows, span, starts
from monitor.periodic import Periodic
from monitor.store import ATTACHED, RUNNING
from monitor.thresholds import (
    AUTOTUNE_MIN_STEPS,
    NOISE_PARTS,
    memory_budget_mb,
    warmup_seconds,
)
from monitor.tuning.policy import (
    Move,
    Observation,
    Policy,
    describe_settings,
    host_note,
    loader_advice,
    memory_left_mb,
    outcome,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from monitor.store import Store

    Request = Callable[[dict[str, Any], str], int | None]

WINDOW_S = 8.0  # the managed workload's measurement window
WINDOW_ENV = "STARVATION_MONITOR_AUTOTUNE_WINDOW_S"  # tests shorten it


def window_s() -> float:
    """The managed workload's window: WINDOW_S unless the environment sets one (>= 2 s)."""
    try:
        return max(2.0, float(os.environ.get(WINDOW_ENV) or WINDOW_S))
    except ValueError:
        return WINDOW_S


@dataclass(frozen=True, slots=True)
class Cadence:
    """When a stretch of one setting is complete: "epoch", "steps" (N) or "window" (s)."""

    kind: str = "epoch"
    steps: int = AUTOTUNE_MIN_STEPS
    seconds: float = WINDOW_S

    @property
    def unit(self) -> str:
        return {"epoch": "epoch", "steps": f"{self.steps}-step stretch",
                "window": f"{self.seconds:g}-s window"}[self.kind]


class RankTuner:
    """One rank's policy and the steps of its current setting not yet judged."""

    def __init__(self, rank: int, max_workers: int, cadence: Cadence) -> None:
        self.rank, self.cadence = rank, cadence
        self.policy = Policy(max_workers, unit=cadence.unit)
        self.buf = pd.DataFrame()
        self.seq: int | None = None  # the config generation in buf
        self.mixed: set[int] = set()  # epochs that began under an older generation
        self.wait_seq: int | None = None  # the generation a request will bring
        self.request: int | None = None  # its control id
        self.announced = False  # the settled line recorded
        self.overridden = False  # the loader settings were changed by someone else
        self.unexpected = False  # the job's config changed without a request of ours
        self.expect: dict[str, Any] | None = None  # the settings last asked for
        self.acked: int | None = None  # the last finished epoch told "judged"
        self.stretches = 0
        self.started: int | None = None  # the generation whose workers' first epoch is out
        self.end: float | None = None  # where the last epoch stretch ended (None: its step)

    def add(self, new: pd.DataFrame) -> None:
        """Keep only the newest generation's steps; note epochs it did not run whole."""
        if new.empty:
            return
        buf = pd.concat([self.buf, new]) if not self.buf.empty else new
        seq = int(buf["config_seq"].max())
        if self.seq is not None and seq > self.seq and self.wait_seq is None:
            self.unexpected = True  # a change nobody here asked for (a step time, a user)
        if self.seq is not None and seq != self.seq or (buf["config_seq"] < seq).any():
            self.mixed |= set(int(e) for e in buf.loc[buf["config_seq"] < seq, "epoch"])
            buf = buf[buf["config_seq"] == seq]
        self.seq, self.buf = seq, buf

    def ready(self, in_flight: int = 0, done: int | None = None,
              persistent: bool = False, done_at: float | None = None) -> pd.DataFrame | None:
        """The next complete stretch of the current setting (taken out of buf), or None;
        where an epoch stretch ends is left in `self.end` (_epoch_end).
        `in_flight`: the batches the setting keeps in flight (its start-up transient);
        `done`: the last epoch the job said it finished (else one is complete once a later
        one has begun), `done_at` when it said so; `persistent`: the setting keeps its
        workers between epochs."""
        self.end = None
        if self.buf.empty or (self.wait_seq is not None and self.seq < self.wait_seq):
            return None
        b, c = self.buf, self.cadence
        if c.kind == "epoch":
            last = int(b["epoch"].max())
            complete = (b["epoch"] < last) | (b["epoch"] <= (done if done is not None else -1))
            whole = complete & ~b["epoch"].isin(self.mixed)
            if persistent and in_flight and self.started != self.seq and whole.any():
                first = int(b.loc[whole, "epoch"].min())  # its workers started in it: once
                self.started = self.seq
                self.mixed.add(first)
                whole &= b["epoch"] != first
            take = b[whole]
            if len(take) < AUTOTUNE_MIN_STEPS:
                return None
            self.buf = b[~complete]
            self.end = _epoch_end(take, self.buf, done, done_at)
            return take
        if c.kind == "steps":
            skip = 0 if self.stretches and self.wait_seq is None else \
                max(2, in_flight, c.steps // 10)
            if len(b) < skip + c.steps:
                return None
            take, self.buf = b.iloc[skip:skip + c.steps], b.iloc[skip + c.steps:]
            return take
        start = float(b["ts"].min())
        live = b[b["ts"] >= start + warmup_seconds(c.seconds * 1.25)]
        if live.empty or float(live["ts"].max() - live["ts"].min()) < c.seconds:
            return None
        self.buf = b.iloc[0:0]
        return live

    def took(self) -> None:
        self.stretches += 1
        self.wait_seq = None


def _epoch_end(take: pd.DataFrame, rest: pd.DataFrame, done: int | None,
               done_at: float | None) -> float | None:
    """Where an epoch stretch ends: when its loop asked for the next epoch (the probe's
    epoch-done mark, written before it waits for the tuner; else the next epoch's first
    batch asked for), so that what the job does between epochs (Lightning's validation)
    counts against the setting as it does in the job's own epoch rate. None when neither
    is known."""
    last = int(take["epoch"].max())
    if done_at is not None and done == last:
        return done_at
    nxt = rest[rest["epoch"] > last]
    if nxt.empty:
        return None
    return float(starts(nxt.sort_values("ts").iloc[:1]).iloc[0])


def std_error(steps: pd.DataFrame, in_flight: int) -> float | None:
    """The standard error of a stretch's throughput, by batch means: the steps cut into up
    to NOISE_PARTS runs of consecutive steps, each at least two prefetch cycles long (2 x the
    batches in flight: workers deliver in bursts, so shorter parts would measure the burst,
    not the rate), each part's rate = its samples / its loop time (Σ wait + compute, gapless
    between consecutive steps). Each epoch's start (its first batch, which waits for the
    workers to start, and the first fill) is left out: it is paid every epoch alike, a
    transient within the stretch, not noise between stretches. None when fewer than two
    parts fit."""
    if "epoch" in steps.columns:
        steps = steps[steps.groupby("epoch").cumcount() > in_flight]
    n = len(steps)
    parts = min(NOISE_PARTS, n // max(4, 2 * in_flight))
    if parts < 2:
        return None
    size = n // parts
    rates = [loop_rate(steps.iloc[i * size:(i + 1) * size]) for i in range(parts)]
    return thresholds.std_error([r for r in rates if r == r])


def observation(window: Window, ctx: Context, settings: dict[str, Any],
                end: float | None = None) -> Observation:
    """The policy's view of a stretch: its assessment, and the noise of its throughput;
    `end`: where an epoch stretch ended (_epoch_end), its throughput then the job's epoch
    rate, the time between its epochs and after the last included."""
    a = assess(window, ctx)
    se = std_error(window.steps, in_flight(settings))
    f = a.features
    advice = next((x for x in a.diagnosis.advice if x.param == "num_workers"), None)
    thr = f.throughput
    if end is not None and not window.steps.empty:
        start, last = span(window.steps)
        if end > last:
            thr = float(window.steps["samples"].sum()) / (end - start)
    return Observation(settings, thr, se, a.verdict, f.data_wait_share,
                       advice.value if advice else None,
                       advice.predicted_throughput if advice else None,
                       f.worker_mb,
                       memory_left_mb(f.mem_available_mb, f.workload_peak_mb,
                                      memory_budget_mb(ctx.memory_budget_mb)),
                       None, f.accelerator == "cuda", f.usable_cores, f.other_cpu_cores,
                       advice.limit if advice else None, loader_advice(a.diagnosis.advice))


class LiveTuner:
    """Drives one Policy per rank from a named daemon thread until stop() or the run ends."""

    def __init__(self, store: Store, run_id: int, ctx: Context, interval: float = 0.2,
                 cadence: Cadence | None = None, request: Request | None = None) -> None:
        """`request(settings, source)`: how a managed workload's owner applies a setting
        (the page's session manager, so its sliders follow); else a control request."""
        self.store, self.run_id, self.ctx, self.interval = store, run_id, ctx, interval
        self.cadence = cadence or Cadence()
        self.request = request
        self.ranks: dict[int, RankTuner] = {}
        self.follower = Follower(store, run_id)  # the steps not read before, per rank
        self._loop = Periodic("starvation-autotune", self._tick, interval,
                              on_error=self._failed, finish=self._finish)
        self.errors: list[str] = []

    def start(self) -> LiveTuner:
        # probes wait for verdicts at their epoch starts
        self.store.set_meta(control.autotune_key(self.run_id), control.ON)
        self.store.add_event(self.run_id, control.AUTOTUNE, "auto-tune on: measuring each "
                             f"{self.cadence.unit}", {"cadence": self.cadence.kind})
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop(10)

    @property
    def alive(self) -> bool:
        return self._loop.alive

    @property
    def settled(self) -> bool:
        return bool(self.ranks) and all(t.announced for t in self.ranks.values())

    def _tick(self) -> bool:
        return self.step() is not False and not self.settled

    def _failed(self, exc: BaseException) -> None:
        """The job goes on; the note says why tuning stopped."""
        self.errors.append(f"{type(exc).__name__}: {exc}")
        self.store.add_event(self.run_id, control.AUTOTUNE, f"auto-tune stopped: {exc}", {})

    def _finish(self) -> None:
        try:
            self.store.set_meta(control.autotune_key(self.run_id), control.OFF)
        finally:
            self.store.close()  # this thread's connection

    def _refused(self, tuner: RankTuner) -> None:
        """A request the job refused (say, a setting its loader cannot take) is a failed
        move: the policy goes back to the best, which the job never left."""
        if tuner.request is None:
            return
        _, result = self.store.control_result(tuner.request)
        if not control.is_refused(result):
            return
        tuner.request, tuner.wait_seq, tuner.expect = None, None, None
        pending = tuner.policy.pending
        if pending is not None:
            tuner.policy.observe(Observation(pending.settings, 0.0, None, "", 0.0,
                                             failed=result))
            self._record_effect(tuner.rank, tuner.policy.moves[-1])

    def step(self) -> bool:
        """One look at the job: False once the run has ended."""
        run = self.store.run(self.run_id) or {}
        info = self.store.ranks(self.run_id)
        ranks = {int(r["rank"]): r["config"] or {} for _, r in info.iterrows()} \
            or {0: run.get("config") or {}}
        world = len(ranks)
        steps = self.follower.steps()
        for r, config in ranks.items():
            tuner = self.ranks.setdefault(
                r, RankTuner(r, max(1, self.ctx.max_workers // world), self.cadence))
            tuner.add(rank_rows(steps, r) if world > 1 else steps)
            settings = {k: config.get(k) for k in LIVE_SETTINGS}
            if tuner.unexpected:  # a takeover only if the loader settings moved
                tuner.unexpected = False
                want = tuner.expect or (tuner.policy.best.settings if tuner.policy.best
                                        else None)
                tuner.overridden = want is not None and want != settings
            if tuner.overridden:
                return self._taken_over(r)
            self._refused(tuner)
            done_epoch, done_at = control.epoch_done(
                self.store.meta(control.epoch_done_key(self.run_id, r)))
            chosen = tuner.ready(in_flight(config), done_epoch,
                                 bool(config.get("persistent_workers")), done_at)
            if chosen is None:
                self._ack(r, done_epoch, tuner)
                continue
            tuner.took()
            host = run_rows(self.store.host_samples(span(chosen)[0], float(chosen["ts"].max())),
                            self.run_id)
            if world > 1:
                host = rank_rows(host, r)
            window = Window({**run, "config": config}, chosen, host)
            if tuner.expect is not None and tuner.expect != settings:
                tuner.overridden = True  # it runs something other than what was asked
            if tuner.overridden:
                return self._taken_over(r)
            tuner.expect = None
            judged = len(tuner.policy.moves)
            move = tuner.policy.observe(observation(window, self.ctx, settings, tuner.end))
            if len(tuner.policy.moves) > judged:  # the last move's measured effect
                self._record_effect(r, tuner.policy.moves[-1])
            if move is not None and move.extend:  # the same setting, one more stretch
                self.store.add_event(self.run_id, control.AUTOTUNE, move.reason, {"rank": r})
            elif move is not None:
                self._request(tuner, move, run, world)
            if tuner.policy.settled and not tuner.announced:
                tuner.announced = True
                self.store.add_event(self.run_id, control.AUTOTUNE, tuner.policy.settled,
                                     {"rank": r})
            self._ack(r, done_epoch, tuner)
        return run.get("status") in (None, RUNNING)

    def _ack(self, rank: int, done: int | None, tuner: RankTuner) -> None:
        """Tell a probe waiting at its epoch start (monitor/probe/patch.py) that the epoch it
        finished has been judged (or pooled), or that the search is over."""
        key = control.ack_key(self.run_id, rank)
        if tuner.policy.settled:
            self.store.set_meta(key, control.SETTLED)
        elif done is not None and done != tuner.acked:
            tuner.acked = done
            self.store.set_meta(key, str(done))

    def _record_effect(self, rank: int, m: dict[str, Any]) -> None:
        gain = m["throughput"] / m["best_before"] - 1 if m["best_before"] else 0.0
        self.store.add_event(self.run_id, control.AUTOTUNE,
                             f"{describe_settings(m['settings'])}: "
                             f"{m['best_before']:,.0f} → {m['throughput']:,.0f} samples/s "
                             f"({gain:+.0%}), {outcome(m)}{host_note(m)}", {**m, "rank": rank})

    def _taken_over(self, rank: int) -> bool:
        """The user changed the loader by hand: it is theirs now."""
        self.store.add_event(self.run_id, control.AUTOTUNE, "auto-tune off: the loader settings "
                             "were changed by hand", {"rank": rank})
        self.errors.append("stopped: the loader settings were changed by hand")
        return False

    def _request(self, tuner: RankTuner, move: Move, run: dict[str, Any], world: int) -> None:
        settings = {k: move.settings.get(k) for k in LIVE_SETTINGS}
        source = control.autotune_source(move.reason)
        if run.get("kind") == ATTACHED:
            tuner.request = self.store.request_control(
                self.run_id, control.CONFIG, control.config_payload(
                    settings, source, tuner.rank if world > 1 else None))
        elif self.request is not None:  # the page's workload: through its session manager
            tuner.request = self.request(settings, source)
        else:  # a managed workload takes a whole configuration
            tuner.request = self.store.request_control(
                self.run_id, control.CONFIG,
                control.config_payload({**(run.get("config") or {}), **settings}, source))
        self.store.add_event(self.run_id, control.AUTOTUNE, move.reason,
                             {**settings, "rank": tuner.rank, "revert": move.revert,
                              "predicted": move.predicted, "limit": move.limit})
        tuner.wait_seq = (tuner.seq or 0) + 1
        tuner.expect = settings

    def summary(self) -> dict[str, Any]:
        per = {r: t.policy.summary() for r, t in sorted(self.ranks.items())}
        out = per.get(0, {"moves": [], "start": None, "final": None, "gain": None,
                          "settled": None})
        if len(per) > 1:
            out = {**out, "ranks": per}
        if self.errors:
            out["error"] = self.errors[-1]
        return out
