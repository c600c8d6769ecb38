"""Helpers the tests share (one of each): the CLI run as a user runs it, a free port, W&B's
offline environment, and the fake clock of the tests that step time by hand. Fakes of
hardware live in tests/fakes/."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, db: Path | str | None = None, timeout: float = 180,
        simulate: bool = True, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    """`python -m monitor ARGS [--db DB]` from the checkout, its output captured; `simulate`:
    the simulated accelerator, as on a machine without CUDA."""
    extra = {"STARVATION_MONITOR_SIMULATE": "1"} if simulate else {}
    return subprocess.run([sys.executable, "-m", "monitor", *args,
                           *(["--db", str(db)] if db is not None else [])],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **extra, **(env or {})})


def wandb_offline(folder: Path) -> dict[str, str]:
    """The environment of a `monitor run --wandb` that writes W&B's run file offline under
    `folder`/wandb (as the tests must: no network), with no run of the caller's own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline",
           "WANDB_DIR": str(folder), "WANDB_SILENT": "true"}
    env.pop("WANDB_RUN_ID", None)
    return env


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Clock:
    """A clock the test moves by hand: `clock()` reads it (each read `step` later, where a
    step is given), `clock.advance(s)` or `clock.t = ...` moves it."""

    def __init__(self, t: float = 1000.0, step: float = 0.0) -> None:
        self.t, self.step = t, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def probe_step(step: int, ts: float, **fields: object) -> tuple:
    """A step as the probe's tuple holds it (STEP_FIELDS' order, monitor/records.py): `step`
    and `ts` given, the other fields by name (epoch, waits and config 0, one sample, the
    optional figures None unless given)."""
    from monitor.records import STEP_FIELDS

    values = {"step": step, "ts": ts, "epoch": 0, "wait_s": 0.0, "compute_s": 0.0,
              "samples": 1, "config_seq": 0, **fields}
    unknown = set(values) - {f.name for f in STEP_FIELDS}
    assert not unknown, f"no such step field: {sorted(unknown)}"
    return tuple(values.get(f.name) for f in STEP_FIELDS)
