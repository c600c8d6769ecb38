"""`python -m monitor run -- python train.py ...`: the parent side of an attached run.

Creates the run, starts the script with the probe injected (monitor/probe/_inject/sitecustomize.py
first on PYTHONPATH) and the run's id in its environment, samples its process tree and GPU,
passes signals through, and ends the run with the script's exit status. Only what the start
needs is imported before the script is started (the store, the relay, the spawn); the
sampler, the outputs' follow, the tuner and the end-of-run summary (attached_summary.py,
pandas with it) are imported while the script starts.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from monitor.config import attached_config
from monitor.manage import outputs, spawn
from monitor.manage.relay import Relay
from monitor.probe.env import RUN_ENV, SCRIPT_ENV
from monitor.probe.epoch_plan import EVERY_ENV
from monitor.probe.phases import ENV as PHASES_ENV
from monitor.probe.writer import transient
from monitor.records import SHM
from monitor.store import ATTACHED, ENV_VAR, FAILED, FINISHED, STOPPED, Store, StoreError, explain
from monitor.thresholds import AUTOTUNE_MIN_STEPS

if TYPE_CHECKING:
    from monitor.manage.runtime import Runtime

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # asking the script to stop


def end_status(rc: int, asked: int | None) -> tuple[str, str | None]:
    """How an attached run ended: `finished` (exit 0), `stopped` (interrupted: Ctrl-C, or a
    stop signal that we forwarded), else `failed` with the exit status."""
    if rc == 0:
        return FINISHED, None
    sig = -rc if rc < 0 else (rc - 128 if rc > 128 else None)
    if sig == signal.SIGINT or (asked is not None and asked in STOPPING):
        name = signal.Signals(asked or sig).name
        return STOPPED, f"interrupted ({name}): the script was asked to stop"
    how = f"signal {-rc} ({signal.Signals(-rc).name})" if rc < 0 else f"exit code {rc}"
    return FAILED, f"the script ended with {how}"


def _take_terminal(pgid: int) -> int | None:
    """Make the script's group the terminal's foreground group (as a shell does for a job),
    so Ctrl-C and terminal reads are the script's. Returns the group to give it back to."""
    try:
        fd = sys.stdin.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            return None
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, old)
        os.killpg(pgid, signal.SIGCONT)  # in case it read the terminal before it was its own
        return os.getpgrp()
    except (OSError, ValueError):
        return None


def _give_back_terminal(pgid: int | None) -> None:
    if pgid is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(sys.stdin.fileno(), pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _supervise(proc: subprocess.Popen, rt: Runtime) -> tuple[int, int | None]:
    """Wait for the script, forwarding signals to its process group (NOTE [shutdown
    protocol] in monitor/manage/runtime.py, 8). Returns (exit status, the stop signal forwarded)."""
    asked: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if signum in STOPPING:
            asked.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    tty = _take_terminal(proc.pid)
    try:
        rc = proc.wait()
    finally:
        _give_back_terminal(tty)
        rt.close()
    return rc, (asked[0] if asked else None)


PID_RETRY_S = 0.5  # a store another process holds locked: the pid's write is tried again


def _record_pid(store: Store, run_id: int, proc: subprocess.Popen) -> threading.Thread:
    """The script's pid, for the store (who is alive to record: Runs.close_orphans). A store
    that another writer holds locked past its busy timeout (a browser of the database, a
    second tool) must not end `monitor run`, nor the script bound to it (NOTE [bound to
    monitor run]): the write is tried again from a thread until it lands or the script
    ends, and said once."""
    def write() -> bool:
        try:
            store.update_run(run_id, pid=proc.pid)
            return True
        except Exception as exc:
            if not transient(exc):
                raise
            return False

    def again() -> None:
        while proc.poll() is None:
            with contextlib.suppress(Exception):
                if write():
                    return
            time.sleep(PID_RETRY_S)  # sleep-ok: a retry's pace, ended by the script's end

    done = threading.Thread(target=lambda: None)
    if not write():
        print(f"starvation-monitor: the store {store.path} is locked by another process; the "
              "script runs on and its steps wait in the relay until the store is free",
              file=sys.stderr)
        done = threading.Thread(target=again, name="record-pid", daemon=True)
    done.start()
    return done


class _Early:
    """What an output's maker reads before the run exists: the store, and the machine's
    context (read only by an output that asks for it: Prometheus's)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def context(self) -> Any:
        from monitor.assess import outcomes
        from monitor.manage.context import machine_context

        return machine_context(None, outcomes.scale_of(self.store))


def script_env(store: Store, run_id: int) -> dict[str, str]:
    """The script's environment: the probe first on its path, the run and store named."""
    return spawn.script_env({RUN_ENV: str(run_id), ENV_VAR: str(store.path.resolve())})


def run_attached(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("error: give the command after --, e.g. python -m monitor run -- python "
              "train.py", file=sys.stderr)
        return 2
    every = args.autotune_every_steps
    if every is not None and (every < AUTOTUNE_MIN_STEPS or not args.autotune):
        print(f"error: --autotune-every-steps takes a number of steps >= {AUTOTUNE_MIN_STEPS} (a "
              "shorter stretch is mostly noise), with --autotune" if args.autotune else
              "error: --autotune-every-steps goes with --autotune: add --autotune",
              file=sys.stderr)
        return 2
    try:
        store = Store(args.db)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # before the run exists: an output that cannot be had (a busy port) creates nothing
        outs = outputs.make(args, _Early(store))
    except outputs.OutputError as exc:
        store.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    view = next((o for o in outs if o.name == "terminal"), None)
    store.close_orphans(later_if_locked=True)  # runs whose recording process is gone
    script = outputs.script_name(cmd)
    run_id = store.create_run(args.name or script, ATTACHED, attached_config(script))
    relay = Relay(store.path.resolve(), run_id)  # NOTE [the relay]
    env = {**script_env(store, run_id), **relay.env(), SCRIPT_ENV: script}
    if every is not None:
        env[EVERY_ENV] = str(every)
    if not args.phases:
        env[PHASES_ENV] = "0"
    live_tty = view is not None and getattr(view, "tty", False)
    relay.start()
    try:
        # its own process group, so signals reach the script and its DataLoader workers
        # together, and the terminal's Ctrl-C is the script's alone (as run bare)
        proc = spawn.start_script(cmd, env, piped=live_tty)
    except OSError as exc:
        relay.stop()
        for out in outs:
            out.close()
        store.finish_run(run_id, FAILED, f"could not start {cmd[0]!r}: {exc}")
        print(f"error: could not start {cmd[0]!r}: {exc}", file=sys.stderr)
        return 127
    pid_kept = _record_pid(store, run_id, proc)
    if not args.autotune:  # what ran, for a later identical run (NOTE [identical runs])
        from monitor.assess import same_runs
        store.update_run(run_id, identity=same_runs.attached_identity(
            cmd, options=[] if args.phases else ["--no-phases"]))
    # the script is starting: what only follows it is imported now
    from monitor.manage.runtime import Runtime
    from monitor.tuning.live import Cadence, LiveTuner

    rt = Runtime(store=store).start(orphans=False)
    rt.collector.follow(proc.pid, run_id)
    print(f"starvation-monitor: run {run_id} recording to {store.path} (pid {proc.pid})",
          file=sys.stderr)
    cadence = Cadence("steps", every) if every else Cadence("epoch")
    tuner = LiveTuner(store, run_id, rt.context(), cadence=cadence).start() \
        if args.autotune else None
    rt.follow(run_id, outs)  # the outputs asked for (monitor/manage/outputs.py)
    if view is not None and live_tty:  # the script's output relayed above the live table
        view.relay(proc.stdout, sys.stdout)
        view.relay(proc.stderr, sys.stderr)
    rc, asked = _supervise(proc, rt)
    pid_kept.join(timeout=PID_RETRY_S)
    lost = relay.stop()  # every step the script put, stored, before its end is judged
    if lost:
        print(f"starvation-monitor: {lost} steps of run {run_id} could not be stored "
              f"({relay.failing or 'the store refused them'})", file=sys.stderr)
    rt.unfollow(run_id)  # the outputs closed: the terminal's view ends before the summary
    if tuner is not None:
        tuner.stop()
    code = rc if rc >= 0 else 128 - rc  # the script's own exit status, as a shell gives it
    from monitor.assess import outcomes
    from monitor.assess.stall import STALL_KINDS, stuck_at_end
    from monitor.manage.attached_summary import named_failure, summary, summary_lines
    from monitor.manage.context import learn
    from monitor.manage.session import remove_left_segments

    try:
        left = remove_left_segments(store, run_id, proc.pid)
        if left:
            store.add_event(run_id, SHM, f"removed {len(left)} /dev/shm segments the job's "
                            "killed processes left", {"removed": left})
        status, error = end_status(rc, asked)
        stuck = stuck_at_end(store.events(run_id, kinds=STALL_KINDS))
        if stuck and status != FINISHED:  # it ended in a stall: that is what went wrong
            status, error = FAILED, f"{stuck} (then: {error or status})"
        named = named_failure(store, run_id) if status == FAILED else None
        if named:  # the loader's error says what ran out: that is the reason, not the exit
            error = f"{named} (then: {error})"
        store.finish_run(run_id, status, error)
        result = summary(store, run_id, rt.context(), remember=True)
        if tuner is not None:
            result["autotune"] = tuner.summary()
        result["outcomes"] = outcomes.of_run(store, run_id)
        result["prediction_scales"] = learn(store, result["outcomes"])
        print("\n".join(summary_lines(result)), file=sys.stderr)
        if args.json:
            print(json.dumps(result, default=str))
    except Exception as exc:  # the store failed: the script's status still passes through
        why = explain(store.path, exc)
        print(f"starvation-monitor: could not record the end of run {run_id}: {why}",
              file=sys.stderr)
        store.note_failure(run_id, f"the store could not be written: {why}")
    return code
