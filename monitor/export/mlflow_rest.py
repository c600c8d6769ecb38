"""MLflow: a live run's per-step input-pipeline figures as metrics of an MLflow run
(`monitor run --mlflow URI`, default $MLFLOW_TRACKING_URI), an Output of the run's follow
(monitor/assess/follow.py). Spoken in MLflow's REST API with the standard library: no
client package to install (`--mlflow` takes a tracking server, http:// or https://).

Where: the run the script itself logs to when it can be found ($MLFLOW_RUN_ID, set for the
script; else a run started after the script, in any experiment, whose `mlflow.source.name`
is the script, searched for during its first FIND_S), else a run of its own, named after the
script, in the experiment $MLFLOW_EXPERIMENT_NAME (default "starvation-monitor"). What:
under `starvation/`, the figures monitor/export/tensorboard.py writes (one window of steps a
point, `step=` the training's step), for a job of many ranks each figure's min and max over
the ranks and the worst rank (Composer's convention for a flat tracker); the verdict and its
advice as tags (`starvation.verdict`, `starvation.advice`) when they change, and at the end
the last verdict with its advice in full as the run's artifact `starvation-monitor.txt`:
through the server's artifact proxy (an `mlflow-artifacts:` artifact URI, `mlflow server`'s
default), or written into the artifact folder of a server on this machine whose artifact
root is a folder; elsewhere (s3://, gs://: MLflow's own client would be needed) it is not
written, and the end says so.

A tracker that is down or slow never slows the job, the store or the other outputs: points
are queued (at most QUEUE_MAX, the oldest dropped first) and sent by a thread of this output
in batches (log-batch: up to 1000 a request, one request each SEND_S at most), each request
bounded by TIMEOUT_S; a failure drops that batch, counted, and waits 2 s, doubling to 15 s,
before the next. At the end the rest goes for FINAL_S at most, and only to a tracker that
answered; what could not be sent is said on stderr and stored as an event of the run.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from typing import Any

import pandas as pd

from monitor.assess.follow import flat_figures, rank_figures, report, said_lost
from monitor.periodic import Periodic

API = "/api/2.0/mlflow/"
PREFIX = "starvation/"
# a tracker on a saturated box answered a log-batch in 2-4 s: 5 s before a request is given up
SEND_S, TIMEOUT_S, FIND_S, FINAL_S = 1.0, 5.0, 10.0, 3.0
QUEUE_MAX, BATCH_MAX = 20_000, 1000
BACKOFF_S, BACKOFF_MAX_S = 2.0, 15.0
EXPERIMENT = "starvation-monitor"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"  # the server's artifact proxy
ARTIFACT = "starvation-monitor.txt"


class MlflowError(RuntimeError):
    """The tracking URI cannot be used; the message says what to give instead."""


def tracking_uri(given: str | None) -> str:
    uri = given or os.environ.get("MLFLOW_TRACKING_URI") or ""
    if not uri:
        raise MlflowError("--mlflow needs a tracking server: --mlflow http://HOST:PORT, or "
                          "set MLFLOW_TRACKING_URI")
    if urllib.parse.urlsplit(uri).scheme not in ("http", "https"):
        raise MlflowError(f"--mlflow {uri!r}: give the tracking server's http:// or https:// "
                          "address (a file store or 'databricks' needs MLflow's own client)")
    return uri.rstrip("/")


class MlflowOutput:
    name, takes_rows = "mlflow", True

    def __init__(self, uri: str | None, store: Any = None, script: str = "script",
                 env: dict[str, str] | None = None) -> None:
        self.uri = tracking_uri(uri)
        self.store, self.script = store, script
        env = env if env is not None else dict(os.environ)
        self.asked_run = env.get("MLFLOW_RUN_ID")
        self.experiment = env.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        self.run_id: int | None = None
        self.mlflow_run: str | None = self.asked_run
        self.own_run = False
        self.started = time.time()
        self.queue: deque[dict[str, Any]] = deque()
        self.tags: dict[str, str] = {}
        self.said: dict[str, str] = {}
        self.report: str | None = None  # the last verdict and its advice, for the artifact
        self.artifact: str | None = None  # where it was written, or why not
        self.sent = self.dropped = self.requests = 0
        self.last_error: str | None = None
        self.last_failure: str | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_S
        self._deadline = 0.0  # set at close: no request goes past it
        self._loop = Periodic("starvation-mlflow", self._send, SEND_S)

    # -- the follow's side (its thread): only queues --------------------------------------
    def start(self, run_id: int) -> None:
        self.run_id = run_id
        self._loop.start()

    def on_rows(self, steps: pd.DataFrame, samples: pd.DataFrame) -> None:
        if steps.empty:
            return
        by_rank = rank_figures(steps, samples)
        last = steps.sort_values("ts").iloc[-1]
        stamp, step = int(float(last["ts"]) * 1000), int(last["step"])
        for k, v in flat_figures(by_rank).items():
            if len(self.queue) >= QUEUE_MAX:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append({"key": PREFIX + k, "value": v, "timestamp": stamp,
                               "step": step})

    def verdict_every(self) -> float:
        return 2.0

    def on_verdict(self, a: Any) -> None:
        if a is None:
            return
        d = a.diagnosis
        texts = {"starvation.verdict": f"{d.named}: {d.headline}",
                 "starvation.advice": "; ".join(f"{x.param} = {x.value}" for x in d.advice)
                 or "none"}
        for k, v in texts.items():
            if self.said.get(k) != v:
                self.said[k] = self.tags[k] = v[:5000]  # MLflow's limit on a tag's value
        self.report = report(self.run_id, a)

    def close(self) -> None:
        """The rest sent, for FINAL_S at most and only to a tracker that answered its last
        request (`monitor run` returns promptly beside one that is down or hung); a request
        still in flight on the sender's thread is waited for FINAL_S at most (a tracker on a
        saturated box answers in seconds: not waiting left its run RUNNING, unreported)."""
        ended = self._loop.stop(FINAL_S)
        self._deadline = time.monotonic() + FINAL_S
        while ended and self.last_error is None and (self.queue or self.tags) and \
                time.monotonic() < self._deadline:
            if not self._send(final=True):
                break
        lost = self.dropped + len(self.queue)
        if self.report and self.mlflow_run and ended and self.last_error is None:
            self._deadline = time.monotonic() + TIMEOUT_S
            self.artifact = self._put_report()
            if self.artifact and not self.artifact.startswith(("mlflow-artifacts:", "/")):
                print(f"starvation-monitor: mlflow: {self.artifact}", file=sys.stderr)
        if self.own_run and self.mlflow_run and ended and self.last_error is None:
            self._deadline = time.monotonic() + TIMEOUT_S  # its end, even past FINAL_S
            self._call("runs/update", {"run_id": self.mlflow_run, "status": "FINISHED",
                                       "end_time": int(time.time() * 1000)}, quiet=True)
        if lost:
            said_lost(self.store, self.run_id, "mlflow",
                      f"mlflow: {lost} of {lost + self.sent} points could not be sent to "
                      f"{self.uri}" + (f" ({self.last_failure})" if self.last_failure else ""),
                      lost)

    # -- its own thread: finds the run, sends --------------------------------------------
    def _call(self, path: str, body: dict[str, Any] | None = None, get: bool = False,
              quiet: bool = False) -> dict[str, Any] | None:
        url = self.uri + API + path
        data = None
        if get and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method="GET" if get else "POST",
                                     headers={"Content-Type": "application/json"})
        self.requests += 1
        left = self._deadline - time.monotonic() if self._deadline else TIMEOUT_S
        if left <= 0:
            return None
        try:
            with urllib.request.urlopen(req, timeout=min(TIMEOUT_S, left)) as r:
                return json.loads(r.read() or b"{}")
        except (OSError, ValueError) as exc:
            self.last_failure = _said(exc)  # (said at the end: a search's failure too)
            if not quiet:
                self.last_error = self.last_failure
            return None

    def _find_run(self) -> str | None:
        """The script's own MLflow run, started after it (by its source name), or None."""
        found = self._call("runs/search", {
            "experiment_ids": self._experiment_ids(), "max_results": 5,
            "filter": f"attributes.start_time >= {int(self.started * 1000) - 5000} and "
                      f"attributes.status = 'RUNNING'",
            "order_by": ["attributes.start_time DESC"]}, quiet=True) or {}
        for run in found.get("runs", []):
            tags = {t["key"]: t["value"] for t in run.get("data", {}).get("tags", [])}
            if os.path.basename(tags.get("mlflow.source.name", "")) == self.script:
                return run["info"]["run_id"]
        return None

    def _experiment_ids(self) -> list[str]:
        got = self._call("experiments/search", {"max_results": 100}, quiet=True) or {}
        return [e["experiment_id"] for e in got.get("experiments", [])] or ["0"]

    def _own_run(self) -> str | None:
        got = self._call("experiments/get-by-name", {"experiment_name": self.experiment},
                         get=True, quiet=True)
        exp = (got or {}).get("experiment", {}).get("experiment_id")
        if exp is None:
            made = self._call("experiments/create", {"name": self.experiment})
            exp = (made or {}).get("experiment_id")
        if exp is None:
            return None
        run = self._call("runs/create", {
            "experiment_id": exp, "start_time": int(self.started * 1000),
            "run_name": f"{self.script} (starvation-monitor run {self.run_id})",
            "tags": [{"key": "starvation.run_id", "value": str(self.run_id)}]})
        self.own_run = run is not None
        return (run or {}).get("run", {}).get("info", {}).get("run_id")

    def _send(self, final: bool = False) -> bool:
        """One batch sent (False: it could not be, dropped and counted, or no run yet)."""
        now = time.monotonic()
        if now < self._retry_at and not final:
            return False
        if self.mlflow_run is None:
            if time.time() - self.started < FIND_S and not final:
                self.mlflow_run = self._find_run()
                if self.mlflow_run is None:
                    return False  # the script may still open its own
            else:
                self.mlflow_run = self._find_run() or self._own_run()
            if self.mlflow_run is None:
                self._failed(now)
                return False
        batch = [self.queue.popleft() for _ in range(min(BATCH_MAX, len(self.queue)))]
        tags = [{"key": k, "value": v} for k, v in self.tags.items()]
        if not batch and not tags:
            return True
        if self._call("runs/log-batch", {"run_id": self.mlflow_run, "metrics": batch,
                                         "tags": tags}) is None:
            self.dropped += len(batch)
            self._failed(now)
            return False
        self.sent += len(batch)
        self.tags.clear()
        self.last_error, self._backoff = None, BACKOFF_S
        return True

    def _put_report(self) -> str | None:
        """The report as the run's artifact ARTIFACT: where it went (its URI or path), a
        sentence saying why it could not, or None when the server did not answer."""
        got = self._call("runs/get", {"run_id": self.mlflow_run}, get=True, quiet=True)
        root = ((got or {}).get("run") or {}).get("info", {}).get("artifact_uri")
        if not root:
            return None
        body = (self.report or "").encode()
        parts = urllib.parse.urlsplit(root)
        if parts.scheme == "mlflow-artifacts":
            base = urllib.parse.urlsplit(self.uri)
            url = urllib.parse.urlunsplit((base.scheme, parts.netloc or base.netloc,
                                           f"{base.path}{ARTIFACTS_API}{parts.path}/{ARTIFACT}"
                                           .replace("//", "/"), "", ""))
            req = urllib.request.Request(url, data=body, method="PUT",
                                         headers={"Content-Type": "text/plain"})
            try:
                with urllib.request.urlopen(req, timeout=TIMEOUT_S):
                    return f"{root}/{ARTIFACT}"
            except OSError as exc:
                return f"the report could not be stored as an artifact ({_said(exc)})"
        here = urllib.parse.urlsplit(self.uri).hostname in (
            "127.0.0.1", "localhost", "::1", socket.gethostname())
        if parts.scheme in ("", "file") and here:  # a local server's folder
            try:
                os.makedirs(parts.path, exist_ok=True)
                path = os.path.join(parts.path, ARTIFACT)
                with open(path, "wb") as f:
                    f.write(body)
                return path
            except OSError as exc:
                return f"the report could not be written into {parts.path} ({exc.strerror})"
        return (f"the report was not stored as an artifact: the run's artifacts live at "
                f"{root}, which needs MLflow's own client (the verdict is in its tags)")

    def _failed(self, now: float) -> None:
        self._retry_at = now + self._backoff
        self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)


def _said(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    reason = getattr(exc, "reason", None)
    return str(reason or exc)
