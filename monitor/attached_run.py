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

from monitor.assess import Context, assess_run
from monitor.attach import DB_ENV, RUN_ENV
from monitor.config import ATTACHED_PREFIX
from monitor.runtime import Runtime
from monitor.store import Store

ROOT = Path(__file__).resolve().parent.parent
INJECT = Path(__file__).resolve().parent / "_inject"
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def summary(store: Store, run_id: int, ctx: Context) -> dict[str, Any]:
    """What `run --json` prints: the same keys as `measure --json`, over the steady state of
    the script's final loader settings (monitor/assess.py steady_window)."""
    run = store.run(run_id) or {}
    out: dict[str, Any] = {"run_id": run_id, "status": run.get("status")}
    a = assess_run(store, run_id, ctx)
    if a is not None:
        out.update(a.to_dict())
    steps = store.steps(run_id)
    out.update(error=run.get("error"), config=run.get("config") or {},
               epochs=int(steps["epoch"].nunique()) if not steps.empty else 0)
    return out


def run_attached(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("error: give the command after --, e.g. python -m monitor run -- python "
              "train.py", file=sys.stderr)
        return 2
    rt = Runtime(args.db)
    store = rt.store
    script = next((Path(c).name for c in cmd[1:] if c.endswith(".py")), Path(cmd[0]).name)
    run_id = store.create_run(args.name or script, "attached",
                              {"preset": "custom", "workload": f"{ATTACHED_PREFIX}{script}"})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(INJECT), str(ROOT), env.get("PYTHONPATH")) if p)
    env[RUN_ENV] = str(run_id)
    env[DB_ENV] = str(store.path.resolve())
    rt.start()
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        store.finish_run(run_id, "failed", f"could not start {cmd[0]!r}: {exc}")
        rt.close()
        print(f"error: could not start {cmd[0]!r}: {exc}", file=sys.stderr)
        return 127
    store.update_run(run_id, pid=proc.pid)
    rt.collector.follow(proc.pid, run_id)
    print(f"starvation-monitor: run {run_id} recording to {store.path} (pid {proc.pid})",
          file=sys.stderr)

    def forward(signum: int, frame: Any) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    # NOTE [shutdown protocol] in monitor/runtime.py, 8. Ctrl-C reaches the script from the
    # terminal (same process group): don't die first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in FORWARDED:
        signal.signal(s, forward)
    try:
        rc = proc.wait()
    finally:
        rt.close()
    if rc == 0:
        store.finish_run(run_id, "finished")
    else:
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        store.finish_run(run_id, "failed", f"the script ended with {how}")
    if args.json:
        print(json.dumps(summary(store, run_id, rt.context()), default=str))
    return rc if rc >= 0 else 128 - rc
