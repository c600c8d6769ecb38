"""`python -m monitor run -- python train.py ...`: the parent side of an attached run.

Creates the run, starts the script with the probe injected (monitor/_inject/sitecustomize.py
first on PYTHONPATH) and the run's id in its environment, samples its process tree and GPU,
passes signals through, and ends the run with the script's exit status.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from monitor.analysis import span, steady_state, summarize
from monitor.attach import DB_ENV, RUN_ENV
from monitor.collector import Collector
from monitor.config import LoaderConfig, max_workers
from monitor.diagnosis import diagnose, features
from monitor.host import cpu_budget
from monitor.store import Store

ROOT = Path(__file__).resolve().parent.parent
INJECT = Path(__file__).resolve().parent / "_inject"
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
WARMUP_S = 2.0


def summary(store: Store, run_id: int) -> dict[str, Any]:
    """The same keys as `measure --json`, over the steps of the script's final loader
    settings (changes from the page start a new generation), after WARMUP_S seconds."""
    run = store.run(run_id) or {}
    steps = store.steps(run_id)
    if not steps.empty:
        steps = steps[steps["config_seq"] == steps["config_seq"].max()]
    settled = steady_state(steps, WARMUP_S)
    steps = settled if len(settled) >= 3 else steps
    out: dict[str, Any] = {"run_id": run_id, "status": run.get("status")}
    out.update(summarize(steps).to_dict())
    cfg = dict(run.get("config") or {})
    if not steps.empty and cfg.get("batch_size"):
        try:
            config = LoaderConfig.build(**{k: v for k, v in cfg.items()
                                           if k in LoaderConfig.__dataclass_fields__})
            start, end = span(steps)
            host = store.host_samples(start, end)
            host = host[host["run_id"] == run_id] if not host.empty else host
            dg = diagnose(features(steps, host, config, cpu_budget()), max_workers())
            out.update(dg.summary_fields())
        except Exception as exc:  # a summary without diagnosis beats none
            out["diagnosis_error"] = f"{type(exc).__name__}: {exc}"
    out.update(error=run.get("error"), config=cfg, epochs=int(steps["epoch"].nunique())
               if not steps.empty else 0)
    return out


def run_attached(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("error: give the command after --, e.g. python -m monitor run -- python "
              "train.py", file=sys.stderr)
        return 2
    store = Store(args.db)
    script = next((Path(c).name for c in cmd[1:] if c.endswith(".py")), Path(cmd[0]).name)
    run_id = store.create_run(args.name or script, "attached",
                              {"preset": "custom", "workload": f"attached:{script}"})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(INJECT), str(ROOT), env.get("PYTHONPATH")) if p)
    env[RUN_ENV] = str(run_id)
    env[DB_ENV] = str(store.path.resolve())
    collector = Collector(store).start()
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        store.finish_run(run_id, "failed", f"could not start {cmd[0]!r}: {exc}")
        collector.stop()
        print(f"error: could not start {cmd[0]!r}: {exc}", file=sys.stderr)
        return 127
    store.update_run(run_id, pid=proc.pid)
    collector.watch(proc.pid, run_id)
    print(f"starvation-monitor: run {run_id} recording to {store.path} (pid {proc.pid})",
          file=sys.stderr)

    def forward(signum: int, frame: Any) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    # Ctrl-C reaches the script from the terminal (same process group): don't die first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in FORWARDED:
        signal.signal(s, forward)
    try:
        rc = proc.wait()
    finally:
        collector.watch(None, None)
        collector.stop()
    if rc == 0:
        store.finish_run(run_id, "finished")
    else:
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        store.finish_run(run_id, "failed", f"the script ended with {how}")
    if args.json:
        print(json.dumps(summary(store, run_id), default=str))
    return rc if rc >= 0 else 128 - rc
