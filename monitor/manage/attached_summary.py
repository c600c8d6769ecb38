"""The end of an attached run, after its script has exited: the run's summary (what `run
--json` prints), the loader failure named, what the probe said of itself, and the lines
people read. Imported by monitor/manage/attached_run.py once the script has started: none
of it is on the path to the script's first line."""
from __future__ import annotations

import time
from typing import Any

from monitor import control
from monitor.assess import outcomes, same_runs
from monitor.assess import probe_notes as notes
from monitor.assess.window import LOADER_KINDS, Context, assess_run, loader_notes
from monitor.diagnosis import NO_DATA, limits
from monitor.frames import analysis
from monitor.manage.result import gpu_figures, result
from monitor.records import EVALUATION, PROBE
from monitor.store import RUNNING, Store
from monitor.tuning.policy import describe_settings as _desc
from monitor.tuning.policy import outcome


def summary(store: Store, run_id: int, ctx: Context, remember: bool = False
            ) -> dict[str, Any]:
    """What `run --json` prints: the same keys as `measure --json`, over the steady state of
    the script's final loader settings (monitor/assess/window.py steady_window); `remember`:
    the run has ended as itself, kept for later identical runs (NOTE [identical runs])."""
    run = store.run(run_id) or {}
    a = assess_run(store, run_id, ctx)
    if remember:
        same_runs.remember(store, run_id, a)
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
        elif notes.no_loader_text(store.events(run_id, kinds=(PROBE,))) is None:
            # a loader was timed (its probe event) and delivered nothing: say what ended it,
            # never "no DataLoader was iterated"
            why = out.get("error") or run.get("error")
            out["verdict_text"] = "The timed loader delivered no batch." + (
                f" {why[0].upper()}{why[1:]}." if why else "")
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
