"""Weights & Biases: a live run's per-step input-pipeline figures in a W&B run (`monitor run
--wandb [PROJECT]`), an Output of the run's follow (monitor/assess/follow.py), with W&B's own
client (the `[wandb]` extra; it never imports torch).

What: under `starvation/`, the figures monitor/export/tensorboard.py writes, one window of
steps a point, against `starvation/step` (the training's step: `define_metric(...,
step_metric=...)`, since W&B cannot write to past steps of a run's own step); for a job of
many ranks each figure's min and max over the ranks and the worst-fed rank (as MLflow's
output: a flat tracker's convention), and each rank's own under `starvation/rank-R/`; the
verdict and its advice in the run's summary (`starvation/verdict`, `starvation/advice`)
when they change, and at the end the last verdict with its advice in full as the run's file
`starvation-monitor.txt`.

Where: the script's own run when its id is known ($WANDB_RUN_ID, set for the script) and W&B
is online: W&B's shared mode, as a secondary writer (x_primary off, labelled
"starvation-monitor", never ending the script's run); otherwise a run of its own in PROJECT
(default $WANDB_PROJECT, else "starvation-monitor"), named after the script, grouped with
the script's run where its id is known (offline runs cannot share one). Offline
(WANDB_MODE=offline) writes under $WANDB_DIR or the working folder, for `wandb sync`.

Never slowing the job: the follow's thread only queues (at most QUEUE_MAX points, the oldest
dropped); this output's own thread starts the W&B run (which may take seconds, or fail: the
points are then dropped and counted) and hands W&B the points, whose own service process
sends them. What could not be handed over is said at the end and stored as an event."""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import Any

import pandas as pd

from monitor.assess.follow import flat_figures, rank_figures, report, said_lost
from monitor.periodic import Periodic

EXTRA = "pip install 'starvation-monitor[wandb]'"
PREFIX = "starvation/"
PROJECT = "starvation-monitor"
LABEL = "starvation-monitor"
REPORT = "starvation-monitor.txt"
# W&B's init waits up to its init_timeout (90 s) for a server that does not answer
SEND_S, FINAL_S, INIT_S, QUEUE_MAX = 1.0, 10.0, 60.0, 20_000


class WandbMissing(RuntimeError):
    """W&B's client is not installed; the message names the pip install."""


def _client() -> Any:
    try:
        import wandb
    except ImportError:
        raise WandbMissing(f"--wandb needs W&B's client: {EXTRA}") from None
    return wandb


class WandbOutput:
    name, takes_rows = "wandb", True

    def __init__(self, project: str | None, store: Any = None, script: str = "script",
                 env: dict[str, str] | None = None) -> None:
        self.wandb = _client()
        env = env if env is not None else dict(os.environ)
        self.project = project or env.get("WANDB_PROJECT") or PROJECT
        self.script_run = env.get("WANDB_RUN_ID")
        self.offline = (env.get("WANDB_MODE") or "").lower() in ("offline", "dryrun")
        self.store, self.script = store, script
        self.run_id: int | None = None
        self.run: Any = None  # the W&B run, once started (its thread's)
        self.shared = False
        self.queue: deque[dict[str, Any]] = deque()
        self.summary: dict[str, str] = {}  # summary values not yet handed over
        self._lock = threading.Lock()  # (the follow's thread writes it, this one reads)
        self.said: dict[str, str] = {}
        self.report: str | None = None
        self.logged = self.dropped = 0
        self.failure: str | None = None  # why the W&B run could not be started
        self._loop = Periodic("starvation-wandb", self._send, SEND_S)

    # -- the follow's side (its thread): only queues --------------------------------------
    def start(self, run_id: int) -> None:
        self.run_id = run_id
        self._loop.start()

    def on_rows(self, steps: pd.DataFrame, samples: pd.DataFrame) -> None:
        if steps.empty:
            return
        by_rank = rank_figures(steps, samples)
        point: dict[str, Any] = {PREFIX + k: v for k, v in flat_figures(by_rank).items()}
        if len(by_rank) > 1:
            for r, figures in by_rank.items():
                point.update({f"{PREFIX}rank-{r}/{k}": v for k, v in figures.items()})
        point[PREFIX + "step"] = int(steps["step"].max())
        if len(self.queue) >= QUEUE_MAX:
            self.queue.popleft()
            self.dropped += 1
        self.queue.append(point)

    def verdict_every(self) -> float:
        return 2.0

    def on_verdict(self, a: Any) -> None:
        if a is None:
            return
        d = a.diagnosis
        texts = {PREFIX + "verdict": f"{d.named}: {d.headline}",
                 PREFIX + "advice": "; ".join(f"{x.param} = {x.value}: {x.reason}"
                                              for x in d.advice) or "none"}
        with self._lock:
            for k, v in texts.items():
                if self.said.get(k) != v:
                    self.said[k] = self.summary[k] = v
        self.report = report(self.run_id, a)

    def close(self) -> None:
        """The rest handed to W&B and its run finished (the script's run, in shared mode,
        is left to the script), for FINAL_S at most; what could not be is said."""
        ended = self._loop.stop(FINAL_S)
        if ended:
            self._send()
            if self.run is not None:
                self._finish()
        else:  # still starting its run: W&B's service is let go (its exit would wait on it)
            self.failure = self.failure or (f"W&B did not start a run within {FINAL_S:.0f} s "
                                            "of the script's end")
            _stop_service(self.wandb)
        lost = self.dropped + len(self.queue)
        if lost:
            why = f" ({self.failure})" if self.failure else ""
            said_lost(self.store, self.run_id, "wandb",
                      f"wandb: {lost} of {lost + self.logged} points could not be logged{why}",
                      lost)

    # -- its own thread: starts the W&B run, hands it the points ---------------------------
    def _send(self) -> None:
        if self.run is None and self.failure is None:
            self._start_run()
        if self.run is None:
            self.dropped += len(self.queue)
            self.queue.clear()
            return
        try:
            while self.queue:
                point = self.queue.popleft()
                self.run.log(point)
                self.logged += 1
            with self._lock:
                summary, self.summary = self.summary, {}
            for k, v in summary.items():
                self.run.summary[k] = v
        except Exception as exc:  # W&B's service gone mid-run: the rest is dropped, said
            self.dropped += 1
            self.failure = f"W&B stopped taking points: {type(exc).__name__}: {exc}"
            self.run = None

    def _start_run(self) -> None:
        wandb = self.wandb
        quiet = dict(silent=True, console="off", x_disable_stats=True, init_timeout=INIT_S,
                     x_disable_machine_info=True, x_save_requirements=False,
                     disable_git=True, save_code=False)
        try:
            if self.script_run and not self.offline:
                self.shared = True
                settings = wandb.Settings(mode="shared", x_primary=False, x_label=LABEL,
                                          x_update_finish_state=False, **quiet)
                self.run = wandb.init(id=self.script_run, project=self.project,
                                      settings=settings, reinit="create_new")
            else:
                settings = wandb.Settings(**quiet)
                self.run = wandb.init(
                    project=self.project, name=f"{self.script} (starvation-monitor run "
                    f"{self.run_id})", group=self.script_run, job_type=LABEL,
                    config={"starvation_monitor_run": self.run_id, "script": self.script},
                    settings=settings, reinit="create_new")
            self.run.define_metric(PREFIX + "step")
            self.run.define_metric(PREFIX + "*", step_metric=PREFIX + "step")
        except Exception as exc:  # a W&B that cannot start a run (no login, no server)
            self.run = None
            self.failure = f"the W&B run could not be started: {type(exc).__name__}: {exc}"
            print(f"starvation-monitor: wandb: {self.failure}", file=sys.stderr)

    def _finish(self) -> None:
        try:
            if self.report:
                path = os.path.join(self.run.dir, REPORT)
                with open(path, "w") as f:
                    f.write(self.report)
                self.run.save(path, base_path=self.run.dir, policy="now")
            # in shared mode x_update_finish_state is off: the script's run is not ended
            self.run.finish()
        except Exception as exc:
            print(f"starvation-monitor: wandb: the run could not be finished: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            self.run = None


def _stop_service(wandb: Any) -> None:
    """End the W&B service process this process started (`wandb-core`, a child of ours),
    then W&B's own teardown, which unregisters its exit hook (that hook would wait on the
    service, which waits on a server that does not answer, and print a traceback once it
    is gone). Each bounded: the teardown runs on a thread of its own, waited for 2 s."""
    try:
        import psutil

        for child in psutil.Process().children():
            if child.name().startswith("wandb-core"):
                child.kill()
                child.wait(2.0)  # reaped: no zombie left
    except Exception:
        pass

    def teardown() -> None:
        try:
            wandb.teardown()
        except BaseException:  # the service is gone: its connection's errors are expected
            pass

    t = threading.Thread(target=teardown, name="starvation-wandb-end", daemon=True)
    t.start()
    t.join(2.0)
