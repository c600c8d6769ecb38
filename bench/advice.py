"""Does the advice pay, and is its prediction right? For each preset, and for the example
script under `monitor run`: measure at num_workers=0, take the first loader advice and its
predicted samples/s, measure the advised setting; twice, interleaved (before, after, before,
after), so that the host's drift falls on both alike.

    python bench/advice.py [--seconds 8] [--presets starving,io-bound,cpu-bound] [--no-script]
                           [--passes 2]

Prints per case: verdict, throughput before and after (means of the rounds), the advice,
its prediction, and the prediction error (predicted / measured - 1); then the mean absolute
error over the cases. Each case's outcome is learnt as an applied change's would be
(monitor/assess/outcomes.py), so a second pass predicts with the machine's scale: the error
before and after the correction. Figures only; nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.assess import outcomes
from monitor.config import LIVE_SETTINGS, LoaderConfig
from monitor.manage.context import learn
from monitor.manage.experiment import step_time_of
from monitor.manage.measure import measure
from monitor.manage.runtime import Runtime
from monitor.store import Store

ROOT = Path(__file__).resolve().parent.parent
SLIDER_PARAMS = (*LIVE_SETTINGS, "batch_size")
HEAD = (f"{'case':<14}{'verdict':<14}{'before':>9}  {'advice':<18}{'predicted':>10}"
        f"{'measured':>10}{'pred err':>9}")


def row(case: str, verdict: str, before: float, advice: str, pred: float | None,
        after: float | None) -> float | None:
    err = pred / after - 1 if pred and after else None
    print(f"{case:<14}{verdict:<14}{before:>9.1f}  {advice:<18}"
          f"{pred or float('nan'):>10.1f}{after or float('nan'):>10.1f}"
          f"{'' if err is None else f'{err:+.0%}':>9}", flush=True)
    return err


def preset_case(rt: Runtime, preset: str, seconds: float, rounds: int) -> float | None:
    cfg = LoaderConfig.build(preset=preset, num_workers=0)
    first = measure(rt, cfg, seconds)
    dg = first.assessment.diagnosis
    adv = next((x for x in dg.advice if x.param in SLIDER_PARAMS), None)
    if adv is None:
        row(preset, dg.verdict, first.summary.throughput, "(no loader change)", None, None)
        return None
    # a calibrated step (starving) is pinned to what the first run used: same device
    cfg = cfg.replace(step_time_ms=cfg.step_time_ms or step_time_of(rt.store, first.run_id))
    befores, afters = [first.summary.throughput], []
    for i in range(rounds):
        afters.append(measure(rt, cfg.replace(**{adv.param: adv.value}), seconds)
                      .summary.throughput)
        if i < rounds - 1:
            befores.append(measure(rt, cfg, seconds).summary.throughput)
    after = statistics.mean(afters)
    learn(rt.store, [{"predicted": adv.predicted_throughput, "measured": after,
                               "limit": adv.limit}])
    return row(preset, dg.verdict, statistics.mean(befores), f"{adv.param} {adv.value}",
               adv.predicted_throughput, after)


def script_run(db: str, nw: int, epochs: int) -> dict:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", db, "--json",
                        "--no-live", "--", sys.executable, str(ROOT / "examples" /
                                                               "train_small.py"),
                        "--epochs", str(epochs), "--num-workers", str(nw)],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def script_case(db: str, epochs: int, rounds: int) -> float | None:
    first = script_run(db, 0, epochs)
    adv = next((x for x in first["advice"] if x["param"] == "num_workers"), None)
    if adv is None:
        row("train_small", first["verdict"], first["throughput"], "(no loader change)",
            None, None)
        return None
    befores, afters = [first["throughput"]], []
    for i in range(rounds):
        afters.append(script_run(db, int(adv["value"]), epochs)["throughput"])
        if i < rounds - 1:
            befores.append(script_run(db, 0, epochs)["throughput"])
    after = statistics.mean(afters)
    learn(Store(db), [{"predicted": adv["predicted_throughput"], "measured": after,
                                "limit": adv.get("limit")}])
    return row("train_small", first["verdict"], statistics.mean(befores),
               f"num_workers {adv['value']}", adv["predicted_throughput"], after)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3, help="the example script's epochs")
    ap.add_argument("--presets", default="starving,io-bound,cpu-bound,healthy")
    ap.add_argument("--no-script", action="store_true")
    ap.add_argument("--passes", type=int, default=2)
    a = ap.parse_args()
    db = str(Path(tempfile.mkdtemp()) / "advice.db")
    for p in range(1, a.passes + 1):
        with Runtime(db) as rt:
            print(f"pass {p}: the machine's scales {outcomes.scale_of(rt.store)}")
            print(HEAD)
            errors = []
            rt.start()
            for preset in a.presets.split(","):
                errors.append(preset_case(rt, preset, a.seconds, a.rounds))
        if not a.no_script:
            errors.append(script_case(db, a.epochs, a.rounds))
        known = [e for e in errors if e is not None]
        if known:
            print(f"mean |prediction error| over {len(known)} cases: "
                  f"{statistics.mean(abs(e) for e in known):.0%} "
                  f"(worst {max(known, key=abs):+.0%})")


if __name__ == "__main__":
    main()
