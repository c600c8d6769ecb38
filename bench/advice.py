"""Does the advice pay? For each preset: measure at num_workers=0, apply the first loader
advice, measure again, and compare with the bound model's prediction.

    python bench/advice.py [--seconds 10] [--presets starving,io-bound,cpu-bound]

Prints verdict, data-wait share, throughput before and after, the measured ratio, and the
prediction error (predicted / measured - 1). Figures only; nothing is asserted.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import LIVE_SETTINGS, LoaderConfig
from monitor.manage.measure import measure
from monitor.manage.runtime import Runtime
from monitor.tuning.experiment import step_time_of

SLIDER_PARAMS = (*LIVE_SETTINGS, "batch_size")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--presets", default="starving,io-bound,cpu-bound,healthy")
    a = ap.parse_args()
    rt = Runtime(Path(tempfile.mkdtemp()) / "advice.db").start()
    store = rt.store
    print(f"{'preset':<11}{'verdict':<16}{'share':>7}{'before':>9}  {'advice':<22}"
          f"{'predicted':>10}{'after':>9}{'ratio':>7}{'pred err':>9}  after verdict")
    for preset in a.presets.split(","):
        cfg = LoaderConfig.build(preset=preset, num_workers=0)
        before = measure(rt, cfg, a.seconds)
        dg = before.assessment.diagnosis
        adv = next((x for x in dg.advice if x.param in SLIDER_PARAMS), None)
        row = (f"{preset:<11}{dg.verdict:<16}{before.summary.data_wait_share:>7.2f}"
               f"{before.summary.throughput:>9.1f}  ")
        if adv is None:
            others = "; ".join(str(x.value) for x in dg.advice) or "none"
            print(row + f"{'(no loader change)':<22}{'':>10}{'':>9}{'':>7}{'':>9}  {others}")
            continue
        # a calibrated step (starving) is pinned to what the first run used: same device
        step = cfg.step_time_ms or step_time_of(store, before.run_id)
        after = measure(rt, cfg.replace(step_time_ms=step, **{adv.param: adv.value}),
                        a.seconds)
        ratio = after.summary.throughput / before.summary.throughput
        err = (adv.predicted_throughput / after.summary.throughput - 1
               if adv.predicted_throughput else float("nan"))
        print(row + f"{adv.param + ' ' + str(adv.value):<22}"
              f"{adv.predicted_throughput or float('nan'):>10.1f}"
              f"{after.summary.throughput:>9.1f}{ratio:>7.2f}{err:>+9.1%}  "
              f"{after.assessment.verdict} ({after.summary.data_wait_share:.2f})", flush=True)


if __name__ == "__main__":
    main()
