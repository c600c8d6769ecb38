"""Identical runs: what ran (a run's identity) and the verdict's line as each run ended, so
that a later run of the same command, settings and host is judged on the side of the line
the earlier one was, where the two runs' figures lie within identical runs' spread."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import socket
from pathlib import Path
from typing import Any

from monitor.records import JUDGED
from monitor.thresholds import (
    NOISE_Z,
    RUN_TO_RUN_WAIT,
    STARVING_SHARE,
    by_the_line,
    noise_band,
)

# NOTE [identical runs]
# A verdict's main line (STARVING_SHARE, the starved share) is judged within a run's own
# noise (features.fed: NOISE_Z x its standard error over the window's parts), and
# borderline is taken as fed. Identical runs spread wider than that error says: ten quiet
# runs of bench/repro/loader.py (per-sample, 2 workers, 6 s) read 9.94-11.20% data wait, a
# standard deviation of 0.43 points where each run's own error was 0.06-0.23, and 7 of the
# 10 read `loop-receive`, 3 `healthy`. A user who runs the same script twice and reads two
# causes trusts neither. A wider band alone moves the flip, it does not remove it: runs
# whose mean sits at the band's edge flip as often. So the store remembers each run's
# identity (the command line, the content of each file it names, the working folder, the
# host and its CPU count, the threads' settings in the environment; a managed run's
# settings) and, as it ended, its starved share, that share's error, which side of the
# line it was judged and its loader settings (a JUDGED event). A later run with the same
# identity and the same loader settings whose share lies within NOISE_Z x the two runs'
# combined noise (each one's error, and RUN_TO_RUN_WAIT for each run) of an earlier run's
# is judged on the earlier run's side of the line, and its headline says so; the earliest
# such run decides, so a third run agrees with the first. A run whose figures moved
# further (another job beside it, a changed dataset the command line does not show) is
# judged on its own. Not remembered: a run the auto-tuner changed, a job of several ranks,
# a run with no steps; a module the script imports is not in its identity. A running run's
# live windows (assess/recent.py of_the_run: the page's banner, Prometheus's verdict and
# cause, the terminal view) are judged against the same ends, with their own, wider error:
# the banner by the line says what the run's final verdict will.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
FILE_MAX_BYTES = 8 << 20  # larger files named on the command line (data): size and mtime


def _host() -> list[Any]:
    return [socket.gethostname(), os.cpu_count()]


def attached_identity(cmd: list[str], options: list[str] = (), cwd: str | None = None) -> str:
    """What an attached run runs: its command (and the monitor's `options` that change the
    run), the files it names, where, on which host."""
    cwd = cwd or os.getcwd()
    parts: list[Any] = [cmd, list(options), cwd, _host(),
                        [os.environ.get(k) for k in THREAD_ENV]]
    for arg in cmd:
        path = Path(cwd, arg)
        try:
            if not path.is_file():
                continue
            st = path.stat()
            parts.append(hashlib.sha1(path.read_bytes()).hexdigest()
                         if st.st_size <= FILE_MAX_BYTES else [st.st_size, st.st_mtime])
        except OSError:
            continue
    return "attached:" + _digest(parts)


def managed_identity(config: dict[str, Any]) -> str:
    """What a managed run runs: its workload's settings, on which host."""
    return "managed:" + _digest([config, _host()])


def _digest(parts: list[Any]) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _settings(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def _error(f: Any) -> float:
    """The starved share's own standard error (the line's noise, features.starving_noise,
    is NOISE_Z of it; the device's idle from CUDA events has none)."""
    return f.starving_noise / NOISE_Z


def earlier(store: Any, run: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The JUDGED records of the runs before `run` with its identity, oldest first."""
    if not run.get("identity") or run.get("id") is None:
        return ()
    return tuple(store.judged_before(run["identity"], int(run["id"]), JUDGED))


def anchor(f: Any, before: tuple[dict[str, Any], ...]) -> Any:
    """Features `f`, judged on the side of the line of the earliest identical run (the same
    loader settings) whose share is within the runs' combined noise of this one's, where
    that side differs from this run's own (features.Features.judged_as)."""
    share = f.starved_share
    if not before or not f.steps or share is None or math.isnan(share):
        return f
    mine = _settings(f.config)
    for e in before:
        if e.get("share") is None or _settings(e.get("config") or {}) != mine:
            continue
        noise = noise_band([_error(f), e.get("se"), RUN_TO_RUN_WAIT, RUN_TO_RUN_WAIT])
        if abs(share - float(e["share"])) > noise:
            continue
        if bool(e.get("fed")) == f.fed:
            return f
        return dataclasses.replace(f, judged_as={"run": e["run"], "share": e["share"],
                                                 "fed": bool(e.get("fed"))})
    return f


def sentence(f: Any) -> str:
    """What the headline adds where an earlier identical run decided the side of the line."""
    j = f.judged_as
    side = "fed" if j["fed"] else "starved"
    return (f"Judged {side}, as run {j['run']} was: the same command, settings and host, and "
            f"its starved share ({by_the_line(j['share'])}) lies within identical runs' "
            f"spread of this one's ({by_the_line(f.starved_share)}), with the "
            f"{STARVING_SHARE:.0%} line inside it.")


def remember(store: Any, run_id: int, a: Any) -> None:
    """Store the verdict's line as run `run_id` ended (assessment `a`), for later identical
    runs; nothing for a run with no identity (one the auto-tuner changed), no steps or
    several ranks."""
    run = store.run(run_id) or {}
    if a is None or not run.get("identity") or not a.features.steps or len(a.ranks) > 1:
        return
    f = a.features
    share = f.starved_share
    if share is None or math.isnan(share):
        return
    store.add_event(run_id, JUDGED, f"ended {a.diagnosis.named}",
                    {"share": float(share), "se": _error(f), "fed": bool(f.fed),
                     "config": f.config, "verdict": a.diagnosis.named})
