"""What a tracker that is down or slow costs the job: the same training script under
`monitor run` without an output, and with `--mlflow` pointed at a tracker that never
answers (a socket that accepts and then says nothing: each request waits its whole timeout),
in interleaved pairs of equal length. The script prints its own rate; the figures are the
script's samples/s per pair and the ratio, and what the output said it dropped.

    python bench/tracker_cost.py [--pairs 3] [--seconds 12] [--tracker mlflow|wandb]

(--tracker wandb: `--wandb` online, its server the same silent socket.)

Figures only (issue 53: "with the tracker's server stopped mid-run the job's throughput is
unchanged"). The script is tests/scripts/causes.py cpu_heavy at 0 workers: a loop whose rate
the main process's CPU sets, so anything the monitor's process took from it would show.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "causes.py"


def silent_tracker() -> tuple[str, socket.socket]:
    """A listening socket that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            held.append(c)
    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{s.getsockname()[1]}", s


def one(seconds: float, silent: str | None, tracker: str) -> tuple[float, str]:
    """The script's rate under `monitor run`, with the tracker's output pointed at `silent`
    (None: no output), and what the output said it dropped."""
    env = dict(os.environ)
    flags: list[str] = []
    if silent and tracker == "mlflow":
        flags = ["--mlflow", silent]
    elif silent:  # W&B online, its server the silent socket
        flags = ["--wandb", "bench"]
        env.update(WANDB_BASE_URL=silent, WANDB_API_KEY="0" * 40, WANDB_SILENT="true")
        env.pop("WANDB_MODE", None)
    with tempfile.TemporaryDirectory() as d:
        env["WANDB_DIR"] = d
        cmd = [sys.executable, "-m", "monitor", "run", "--no-live", "--db", f"{d}/b.db",
               *flags, "--", sys.executable, str(SCRIPT),
               "cpu_heavy", "--workers", "0", "--seconds", str(seconds)]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env=env)
    m = re.search(r"rate [\d.]+ batches/s \(\d+ batches, (\d+) samples/s\)", r.stdout)
    dropped = next((ln for ln in r.stderr.splitlines() if "could not be" in ln), "")
    return (float(m.group(1)) if m else float("nan")), dropped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--tracker", choices=("mlflow", "wandb"), default="mlflow")
    a = ap.parse_args()
    uri, sock = silent_tracker()
    ratios = []
    for i in range(a.pairs):
        order = [None, uri] if i % 2 == 0 else [uri, None]
        got = {}
        for target in order:
            got[target] = one(a.seconds, target, a.tracker)
        bare, (down, said) = got[None][0], got[uri]
        ratios.append(down / bare)
        print(f"pair {i + 1}: no tracker {bare:,.0f} samples/s, tracker silent {down:,.0f} "
              f"({down / bare - 1:+.1%}); {said.strip() or 'nothing said'}", flush=True)
    print(f"median ratio {statistics.median(ratios):.3f} over {a.pairs} pairs "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    sock.close()


if __name__ == "__main__":
    main()
