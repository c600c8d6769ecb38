"""Real jobs that several test files read, each run once: a run is what the suite's CPU is
made of (an interpreter and `import torch` a rank and a launcher, ~3 CPU-s a rank beside
the job's own work: bench/suite_cpu.py), so where tests only read different outputs of the
same job they read one. The tests that read a job share its xdist group (`GROUP`), so one
pytest worker runs it, once, and its fixture (tests/conftest.py) checks what `no_leaks`
checks for a test's own job."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import wait_for
from tests.helpers import wandb_offline

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
GROUP = "two-rank-job"


@dataclass
class Job:
    """A finished `monitor run` of a job: its exit code, its `--json` summary, its output,
    its store and its outputs' folders, and a scrape of its /metrics taken while every rank
    was stepping (None: no scrape showed them all)."""
    returncode: int
    summary: dict | None
    out: str
    err: str
    db: Path
    tensorboard: Path
    wandb: Path
    metrics: str | None


def _stepping(url: str, ranks: set[str]) -> str | None:
    """The /metrics text once each of `ranks` has counted a step, else None."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    counted = re.findall(r'^starvation_steps_total\{[^}]*\brank="(\d+)"[^}]*\} (\S+)', text,
                         re.M)
    return text if {r for r, v in counted if float(v) > 0} == ranks else None


def two_rank_job(folder: Path, port: int) -> Job:
    """examples/train_ddp.py as a one-node torchrun job of two ranks (gloo, CPU, 3 epochs,
    neither rank slow) under `monitor run --json` with every output a user may ask for at
    once: the Prometheus endpoint (scraped while it runs), TensorBoard and W&B (offline)."""
    env = wandb_offline(folder)
    db, said = folder / "job.db", (folder / "stdout.txt", folder / "stderr.txt")
    with open(said[0], "w") as out, open(said[1], "w") as err:  # (files: nobody reads a
        p = subprocess.Popen(  # pipe while the endpoint is polled)
            [sys.executable, "-m", "monitor", "run", "--db", str(db), "--json", "--no-live",
             "--metrics-port", str(port), "--tensorboard", str(folder / "tb"), "--wandb",
             "sm-test", "--", TORCHRUN, "--standalone", "--nproc-per-node=2",
             str(ROOT / "examples" / "train_ddp.py"), "--epochs", "3"],
            cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    got = wait_for(lambda: "ended" if p.poll() is not None else _stepping(url, {"0", "1"}),
                   timeout=180, every=0.25)
    metrics = None if got == "ended" else got
    try:
        p.wait(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out, err = (f.read_text() for f in said)
    last = [ln for ln in out.splitlines() if ln.startswith("{")]
    return Job(p.returncode, json.loads(last[-1]) if last else None, out, err, db,
               folder / "tb", folder / "wandb", metrics)
