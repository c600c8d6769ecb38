"""The step's phases (issue 34) as `monitor run --json` reports them, for
examples/train_small.py and the Lightning and HF Trainer scripts of the suite, each run from
a training venv without the product's own requirements but those the HF Trainer's own
dependencies bring (KEEP; bench/frameworks.py's venv), with no
line of the scripts changed. Prints a markdown table: each phase's share of the step and
its ms a step, and which clock timed them. Figures only.

    python bench/phases_table.py        (a few minutes on 2 cores)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frameworks import ROOT, monitor_run, training_venv

# what the HF Trainer's own dependencies bring into a user's venv (accelerate: psutil;
# datasets, which the Trainer imports when installed: pandas, pyarrow)
KEEP = ("psutil", "pandas", "pyarrow")
PHASES = ("data_wait", "copy", "forward", "backward", "optimizer", "other")
CASES = [  # (name, script under tests/scripts or a path, its arguments)
    ("examples/train_small.py", str(ROOT / "examples" / "train_small.py"), ()),
    ("Lightning (lightning_fit.py)", "lightning_fit.py",
     ("--epochs", "4", "--samples", "384", "--work", "60")),
    ("HF Trainer (hf_trainer.py)", "hf_trainer.py",
     ("--epochs", "4", "--samples", "320", "--work", "100")),
]


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        py = training_venv(tmp, keep=KEEP)
        print("| script | steps | verdict | " + " | ".join(PHASES) + " | timed by |")
        print("|---" * (len(PHASES) + 4) + "|")
        for i, (name, script, args) in enumerate(CASES):
            j = monitor_run(tmp / f"{i}.db", py, script, *args)["json"]
            ph = j.get("phases") or {}
            per = ph.get("seconds_per_step") or {}
            cells = [f"{100 * ph[k]:.0f}% ({1e3 * per.get(k, 0.0):.2f} ms)"
                     if ph.get(k) is not None else "n/a" for k in PHASES]
            print(f"| {name} | {j['steps']} | {j['verdict']} | " + " | ".join(cells)
                  + f" | {ph.get('source', 'no phases')} |", flush=True)


if __name__ == "__main__":
    main()
