"""Real frameworks under `monitor run --json`, from a training venv without the product's own
requirements (a venv whose site-packages sees torch, lightning, transformers and accelerate,
and not pandas, psutil, streamlit, plotly, pyarrow, pynvml or prometheus-client): stored
step counts against epochs x batches, batch size, ranks, the verdict beside bare runs at two
settings, and --autotune on the Lightning script from num_workers=0.
`python bench/frameworks.py` (a few minutes on 2 cores)."""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SCRIPTS = ROOT / "tests" / "scripts"
OURS = {"pandas", "psutil", "streamlit", "plotly", "pyarrow", "pynvml", "prometheus_client",
        "tsdownsample", "monitor", "workloads"}


def training_venv(tmp: Path, keep: tuple[str, ...] = ()) -> str:
    """A venv that links every package of this one except our own requirements (but those
    named in `keep`: what the HF Trainer's dependencies bring into a user's venv)."""
    import torch

    site_src = Path(torch.__file__).resolve().parent.parent
    venv = tmp / "train-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    farm = tmp / "farm"
    farm.mkdir()
    for p in site_src.iterdir():
        top = p.name.split("-")[0].split(".")[0].lower()
        if top not in keep and (top in OURS or top.startswith((
                "pandas", "streamlit", "psutil", "plotly", "pyarrow", "nvidia_ml", "prometheus"))):
            continue
        (farm / p.name).symlink_to(p)
    (site / "farm.pth").write_text(f"{farm}\n")
    return str(venv / "bin" / "python")


def monitor_run(db: Path, python: str, script: str, *args: str, flags=()) -> dict:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        *flags, "--", python, str(SCRIPTS / script), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-3000:])
    return {"json": json.loads(r.stdout.strip().splitlines()[-1]), "out": r.stdout,
            "err": r.stderr}


def epoch_rates(text: str) -> list[float]:
    """The script's own per-epoch samples/s (its "epoch N: ... samples/s" lines only)."""
    return [float(x) for x in re.findall(r"epoch \d+: \d+ samples, ([\d.]+) samples/s", text)]


def bare_pair(py: str, script: str, args: tuple) -> str:
    """The script alone (no monitor) at num_workers 0 and 2: its own median epoch rate
    (every rank's epochs; epoch 0 left out when there are more)."""
    out = []
    for nw in (0, 2):
        text = subprocess.run([py, str(SCRIPTS / script), *args, "--num-workers", str(nw)],
                              capture_output=True, text=True, timeout=900).stdout
        lines = re.findall(r"epoch (\d+): \d+ samples, ([\d.]+) samples/s", text)
        r = [float(v) for e, v in lines if e != "0"] or [float(v) for _, v in lines]
        out.append(f"num_workers={nw} {statistics.median(r):.0f} samples/s")
    return ", ".join(out)


def stored(db: Path, run_id: int) -> tuple[int, dict, list]:
    from monitor.store import Store

    s = Store(db)
    steps = s.steps(run_id)
    return len(steps), steps.groupby("rank").size().to_dict(), sorted(set(steps["samples"]))


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        py = training_venv(tmp)
        r = subprocess.run([py, "-c", "import lightning, transformers, accelerate\n"
                            "try:\n import pandas\nexcept ImportError: print('no pandas')"],
                           capture_output=True, text=True)
        print(f"training venv: {py}: {r.stdout.strip() or r.stderr[-300:]}")
        lf = ("--epochs", "4", "--samples", "384", "--work", "60")  # 12 batches of 32
        bare = {nw: subprocess.run([py, str(SCRIPTS / "lightning_fit.py"), *lf,
                                    "--num-workers", str(nw)], capture_output=True,
                                   text=True, timeout=900).stdout for nw in (0, 2)}
        rates = {nw: statistics.median(epoch_rates(t)[1:]) for nw, t in bare.items()}
        print(f"lightning bare: samples/s per epoch (median, epoch 0 left out): "
              f"num_workers=0 {rates[0]:.0f}, num_workers=2 {rates[2]:.0f}")
        a = monitor_run(tmp / "l.db", py, "lightning_fit.py", *lf)
        n, per, bs = stored(tmp / "l.db", a["json"]["run_id"])
        print(f"lightning defaults: stored {n} steps (4 x 12 = 48), batch sizes {bs}, "
              f"verdict {a['json']['verdict']}: {a['json']['verdict_text'][:160]}")
        adv = (a["json"].get("advice") or [{}])[0]
        print(f"  advice 1: {adv.get('reason')}")
        # 48 batches a rank an epoch: long enough for the host sampler to see both ranks
        df = ("--epochs", "3", "--samples", "3072", "--devices", "2", "--work", "60",
              "--no-val")
        print(f"lightning ddp bare: {bare_pair(py, 'lightning_fit.py', df)}")
        b = monitor_run(tmp / "d.db", py, "lightning_fit.py", *df)
        n, per, bs = stored(tmp / "d.db", b["json"]["run_id"])
        print(f"lightning ddp devices=2: world_size {b['json'].get('world_size')}, steps per "
              f"rank {per} (3 x 48 each), verdict {b['json']['verdict']}: "
              f"{b['json']['verdict_text'][:120]}")
        hf = ("--epochs", "4", "--samples", "320", "--work", "100")
        print(f"hf trainer bare: {bare_pair(py, 'hf_trainer.py', hf)}")
        c = monitor_run(tmp / "h.db", py, "hf_trainer.py", *hf)
        n, per, bs = stored(tmp / "h.db", c["json"]["run_id"])
        print(f"hf trainer: stored {n} steps (4 x 20 = 80), batch sizes {bs}, config batch "
              f"{c['json']['config'].get('batch_size')}, verdict {c['json']['verdict']}: "
              f"{c['json']['verdict_text'][:120]}")
        # --autotune from num_workers=0 on epochs of 96 batches (3,072 samples): the bare
        # runs at 0 and 2 workers first, then the tuned run; its own epoch rates, the
        # epochs it ran at the start setting against its last
        tf = ("--samples", "3072", "--work", "60")
        bare = {nw: epoch_rates(subprocess.run(
            [py, str(SCRIPTS / "lightning_fit.py"), "--epochs", "4", *tf, "--num-workers",
             str(nw)], capture_output=True, text=True, timeout=900).stdout) for nw in (0, 2)}
        print(f"lightning bare, 96 batches an epoch: num_workers=0 "
              f"{[round(x) for x in bare[0]]}, num_workers=2 {[round(x) for x in bare[2]]}")
        t = monitor_run(tmp / "t.db", py, "lightning_fit.py", "--epochs", "8", *tf,
                        flags=("--autotune",))
        er = epoch_rates(t["out"])
        tune = t["json"].get("autotune") or {}
        moves = tune.get("moves") or []
        from monitor.store import Store

        steps = Store(tmp / "t.db").steps(t["json"]["run_id"])
        first = steps[steps["config_seq"] == steps["config_seq"].min()]
        whole = [int(e) for e, g in first.groupby("epoch") if len(g) == 96]
        start = [er[e] for e in whole if e < len(er)] or er[:1]  # at num_workers=0
        print(f"lightning --autotune from num_workers=0: epoch samples/s {[round(x) for x in er]}"
              f"; final {tune.get('final')}; {tune.get('settled')}")
        print(f"  last epoch {er[-1]:.0f} against {statistics.mean(start):.0f} at the start "
              f"setting (epochs {whole}: {er[-1] / statistics.mean(start) - 1:+.0%})")
        for m in moves:
            print(f"  move: {m['settings']} {m['throughput']:.0f} vs {m['best_before']:.0f}, "
                  f"kept {m['kept']}")

if __name__ == "__main__":
    main()
