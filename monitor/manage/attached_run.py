"""`python -m monitor run -- python train.py ...`: the parent side of an attached run.

Creates the run, starts the script with the probe injected (monitor/probe/_inject/sitecustomize.py
first on PYTHONPATH) and the run's id in its environment, samples its process tree and GPU,
passes signals through, and ends the run with the script's exit status.
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
from typing import Any

from monitor import control
from monitor.assess import outcomes
from monitor.assess import probe_notes as notes
from monitor.assess.stall import STALL_KINDS, stuck_at_end
from monitor.assess.window import LOADER_KINDS, Context, assess_run, loader_notes
from monitor.config import attached_config
from monitor.diagnosis import NO_DATA, limits
from monitor.frames import analysis
from monitor.manage import outputs, spawn, terminal
from monitor.manage.context import learn
from monitor.manage.relay import Relay
from monitor.manage.result import gpu_figures, result
from monitor.manage.runtime import Runtime
from monitor.manage.session import remove_left_segments
from monitor.probe.epoch_plan import EVERY_ENV
from monitor.probe.patch import DB_ENV, RUN_ENV, SCRIPT_ENV
from monitor.probe.phases import ENV as PHASES_ENV
from monitor.probe.writer import transient
from monitor.records import EVALUATION, PROBE, SHM
from monitor.store import ATTACHED, FAILED, FINISHED, RUNNING, STOPPED, Store, StoreError, explain
from monitor.thresholds import AUTOTUNE_MIN_STEPS
from monitor.tuning.live import Cadence, LiveTuner
from monitor.tuning.policy import describe_settings as _desc
from monitor.tuning.policy import outcome

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def summary(store: Store, run_id: int, ctx: Context) -> dict[str, Any]:
    """What `run --json` prints: the same keys as `measure --json`, over the steady state of
    the script's final loader settings (monitor/assess/window.py steady_window)."""
    run = store.run(run_id) or {}
    a = assess_run(store, run_id, ctx)
    out = result(run_id, run.get("status"), a, gpu_figures(store, run, a), run.get("error"),
                 run.get("accelerator"), run.get("config") or {})
    steps = store.steps(run_id)
    out["epochs"] = int(steps["epoch"].nunique()) if not steps.empty else 0
    # passes over the training loader with gradients off (evaluation): not in the steps
    out["evaluation_passes"] = len(store.events(run_id, kinds=(EVALUATION,)))
    out.update(probe_notes(store, run_id, steps.empty))
    if out.get("verdict_family") == NO_DATA and not steps.empty and run.get("status") != RUNNING:
        out["verdict_text"] = " ".join(
            [f"{len(steps)} step(s) recorded before the run ended: too few to judge."]
            + [x["text"][0].upper() + x["text"][1:] for x in out.get("findings") or []])
    if out.get("timing_stopped") and not steps.empty and out.get("verdict_text"):
        stop = out["timing_stopped"]
        at = f" at step {stop['at_step']}" if stop.get("at_step") is not None else ""
        out["verdict_text"] += (f" Timing stopped{at}: {stop['error']}; this covers the "
                                "steps before it.")
    if steps.empty and run.get("status") not in (None, RUNNING):
        found = [x["text"][0].upper() + x["text"][1:] for x in out.get("findings") or []]
        if "timing_stopped" in out:
            out["verdict_text"] = out["timing_stopped"]["text"]
        elif found:  # a loader was timed and never delivered: what stopped it
            out["verdict_text"] = " ".join(["The timed loader delivered no batch.", *found])
        else:
            out["verdict_text"] = notes.NO_LOADER
    return out


def named_failure(store: Store, run_id: int) -> str | None:
    """The cause of a loader error that reached the script (/dev/shm, descriptors, the OOM
    killer: monitor/diagnosis/limits.py), in a sentence with its numbers."""
    report, errors = loader_notes(store.events(run_id, kinds=LOADER_KINDS))
    if not errors:
        return None
    end = store.last_step_ts(run_id) or time.time()  # the memory as last sampled
    host = analysis.run_rows(store.host_samples(end - 30.0, time.time()), run_id)
    found = limits.failure(errors[-1], report, host)
    return found.text if found is not None else None


def probe_notes(store: Store, run_id: int, no_steps: bool) -> dict[str, Any]:
    """What the probe said of itself (monitor/assess/probe_notes.py); for a run with no
    steps, why none were timed, stored as the run's probe event."""
    ev = store.events(run_id, kinds=(PROBE,))
    out: dict[str, Any] = {"retune": notes.retune(ev)}
    stop = notes.timing_stopped(ev)
    said = store.meta(control.probe_stopped_key(run_id, 0))
    if stop is None and said:  # the probe's event could not be written, its note could
        stop = {"what": "recording", "text": said, "error": said, "at_step": None,
                "loader": None, "where": None}
    text = notes.no_loader_text(ev) if no_steps and stop is None else None
    if text is not None:
        if not (ev["label"] == text).any():
            store.add_event(run_id, PROBE, text, {"no_loader": True})
        stop = {"what": "no loader", "text": text, "at_step": 0, "error": text,
                "loader": None, "where": None}
    if stop is not None:
        out["timing_stopped"] = stop
    return out


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


def summary_lines(d: dict[str, Any]) -> list[str]:
    """The end-of-run summary for people (stderr: the script's stdout stays its own)."""
    if not d.get("steps"):
        return [f"starvation-monitor: run {d['run_id']} {d.get('status')}: no steps recorded"
                + (f": {d['verdict_text']}" if d.get("verdict_text") else "")]
    world = d.get("world_size") or 1
    who = f"the job, {world} ranks" if world > 1 else "steady state"
    out = [f"starvation-monitor: run {d['run_id']} {d.get('status')}: "
           f"{d['throughput']:,.0f} samples/s ({who}), data-wait share "
           f"{d['data_wait_share']:.0%}",
           f"  verdict: {d['verdict']}. {d['verdict_text']}"]
    if world > 1:
        out += [f"  rank {r['rank']} ({r['host']}): {r['throughput']:,.0f} samples/s, "
                f"data-wait share {r['data_wait_share']:.0%}, wait "
                f"{r['wait_per_step_s'] * 1000:.0f} ms/step, compute "
                f"{r['compute_per_step_s'] * 1000:.0f} ms/step, num_workers {r['workers']}"
                for r in d["ranks"]]
    out += [f"  finding: {x['cause']}: {x['text']}" for x in d.get("findings") or []]
    out += [f"  advice {i}: {a['reason']}" for i, a in enumerate(d.get("advice") or [], 1)]
    tune = d.get("autotune")
    if tune is not None:
        per = tune.get("ranks") or {0: tune}
        for r, t in per.items():
            who = f"autotune rank {r}" if len(per) > 1 else "autotune"
            out += [f"  {who} move {i}: {_desc(m['settings'])} ({m['reason']}) → "
                    f"{m['throughput']:,.0f} samples/s"
                    + (f" (predicted {m['predicted']:,.0f}, "
                       f"{m['throughput'] / m['predicted'] - 1:+.0%})"
                       if m.get("predicted") else "") + f", {outcome(m)}"
                    for i, m in enumerate(t["moves"], 1)]
            out.append(f"  {who}: {t['settled'] or 'still searching when the job ended'}")
        if tune.get("error"):
            out.append(f"  autotune {tune['error']}")
    line = outcomes.error_line(d.get("outcomes") or [])
    if line:
        out.append(f"  {line}")
    return out


def script_env(store: Store, run_id: int) -> dict[str, str]:
    """The script's environment: the probe first on its path, the run and store named."""
    return spawn.script_env({RUN_ENV: str(run_id), DB_ENV: str(store.path.resolve())})


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
        rt = Runtime(args.db)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = rt.store
    try:  # before the run exists: an output that cannot be had (a busy port) creates nothing
        outs = outputs.make(args, rt)
    except outputs.OutputError as exc:
        rt.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    view = next((o for o in outs if isinstance(o, terminal.LiveView)), None)
    script = outputs.script_name(cmd)
    run_id = store.create_run(args.name or script, ATTACHED,
                              attached_config(script))
    relay = Relay(store.path.resolve(), run_id)  # NOTE [the relay]
    env = {**script_env(store, run_id), **relay.env(), SCRIPT_ENV: script}
    if every is not None:
        env[EVERY_ENV] = str(every)
    if not args.phases:
        env[PHASES_ENV] = "0"
    rt.start()
    live_tty = view is not None and view.tty
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
        rt.close()
        print(f"error: could not start {cmd[0]!r}: {exc}", file=sys.stderr)
        return 127
    pid_kept = _record_pid(store, run_id, proc)
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
        result = summary(store, run_id, rt.context())
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
