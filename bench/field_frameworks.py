"""The field's frameworks (issue 51's table), each unmodified under `monitor run --json` from
a training venv of the user's (PyPI's torch and the frameworks; none of the product's
requirements needed there), beside the same command bare: steps stored against the script's
own (epochs x batches, every rank), the batch size, the ranks, the verdict, the first advice,
and the exit codes bare / monitored.

    python bench/field_frameworks.py [--python VENV/bin/python] [--only NAME ...]

The venv: the Makefile's .venv-vision (torch, torchvision, ultralytics) by default; a case
whose framework it lacks is listed as such (`pip install fastai torchdata torch_geometric
"ray[train]"` there adds them). A few minutes on 2 cores, Ray's the longest."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SCRIPTS = ROOT / "tests" / "scripts"

# name, the module it needs, the command (after the venv's python or its bin/), steps
# expected a rank, ranks expected
CASES = [
    ("fastai Learner.fit", "fastai", ["python", "fastai_fit.py", "2"], 2 * 12, [0]),
    ("torchdata.nodes Loader", "torchdata.nodes", ["python", "nodes_loader.py", "process", "2"],
     3 * 6, [0]),
    ("PyG mutag_gin shape", "torch_geometric", ["python", "pyg_mutag.py", "20"], 20 * 15, [0]),
    ("Ray Train TorchTrainer", "ray.train", ["python", "ray_train.py"], 3 * 32, [0, 1]),
    ("torchvision train -j 0", "torchvision", ["python", "vision_train.py", "{tmp}/img", "-j",
                                               "0", "--epochs", "3"], 3 * 6, [0]),
    ("torchvision train -j 2", "torchvision", ["python", "vision_train.py", "{tmp}/img", "-j",
                                               "2", "--epochs", "3"], 3 * 6, [0]),
    ("yolo train", "ultralytics", ["yolo", "train", "model=yolov8n.yaml",
                                   "data={tmp}/yolo/data.yaml", "epochs=4", "imgsz=64",
                                   "batch=8", "device=cpu", "plots=False",
                                   "project={tmp}/runs", "exist_ok=True"], 4 * 4, [0]),
    ("Ultralytics trainer, 2 workers", "ultralytics",
     ["python", "yolo_train.py", "{tmp}/yolo", "--workers", "2", "--epochs", "3"], 3 * 4, [0]),
    ("workers raising ImportError", "torch", ["python", "failing_workers.py"], 0, []),
]


def command(venv_bin: Path, parts: list[str], tmp: Path) -> list[str]:
    exe = str(venv_bin / parts[0])
    rest = [p.format(tmp=tmp) for p in parts[1:]]
    if parts[0] == "python":
        rest[0] = str(SCRIPTS / rest[0])
    return [exe, *rest]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=str(ROOT / ".venv-vision" / "bin" / "python"))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    venv_bin = Path(args.python).parent
    from monitor.store import Store

    print("| framework (script) | steps stored / expected | batch | ranks | verdict | "
          "first advice | rc bare / monitored |")
    print("|---|---|---|---|---|---|---|")
    for name, module, parts, per_rank, ranks in CASES:
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        has = subprocess.run([args.python, "-c", f"import {module}"], capture_output=True)
        if has.returncode != 0:
            print(f"| {name} | not in this venv ({module}) | | | | | |")
            continue
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp / "u"),
                   "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
            subprocess.run([args.python, str(SCRIPTS / "yolo_train.py"), str(tmp / "yolo"),
                            "--dataset-only"], capture_output=True, env=env)
            cmd = command(venv_bin, parts, tmp)
            bare = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env,
                                  timeout=900)
            db = tmp / "m.db"
            mon = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db),
                                  "--json", "--", *cmd], capture_output=True, text=True,
                                 cwd=tmp, env={**env, "PYTHONPATH": str(ROOT)}, timeout=900)
            try:
                j = json.loads(mon.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print(f"| {name} | no JSON: {mon.stderr[-200:]!r} | | | | | "
                      f"{bare.returncode} / {mon.returncode} |")
                continue
            steps = Store(db).steps(j["run_id"])
            got = steps.groupby("rank").size().to_dict() if len(steps) else {}
            want = per_rank * max(len(ranks), 1) if ranks else 0
            adv = (j.get("advice") or [{}])[0]
            first = (f"{adv['param']} {adv['value']}" if adv.get("param") else "none")
            text = (j.get("verdict_text") or "")[:90].replace("|", "/")
            print(f"| {name} | {len(steps)} / {want} {dict(got) if len(ranks) > 1 else ''} | "
                  f"{(j.get('config') or {}).get('batch_size')} | "
                  f"{sorted(got) if got else '-'} | {j['verdict']}: {text} | {first} | "
                  f"{bare.returncode} / {mon.returncode} |", flush=True)


if __name__ == "__main__":
    main()
