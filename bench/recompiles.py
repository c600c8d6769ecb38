"""torch.compile recompiling on changing shapes (issue 54): tests/scripts/recompiles.py (a
plain script, no monitor imports) bare, recompiling and with one shape (`--buckets`),
interleaved, against what `monitor run --json` predicts for one shape (its first advice's
predicted throughput over the window's). Rates are the script's own, without its first step
(which compiles in either variant).

    python bench/recompiles.py [--pairs 3] [--epochs 4]

Each run compiles cold, with a compile cache of its own (TORCHINDUCTOR_CACHE_DIR in a new
folder), as in a fresh container; `--warm` shares one across the runs.

Prints one markdown row a pair; figures only, nothing is asserted (tests/test_compiles.py
asserts the finding).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "recompiles.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def cache(tmp: str, warm: bool) -> dict[str, str]:
    """The environment of a run: its own compile cache, or the shared one (--warm)."""
    return {**ENV, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=tmp)} if not warm else ENV


def bare(epochs: int, env: dict[str, str], *extra: str) -> float:
    r = subprocess.run([sys.executable, str(SCRIPT), "--epochs", str(epochs), *extra],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    m = re.search(r"after the first step ([\d.]+) samples/s", r.stdout)
    return float(m[1]) if m else float("nan")


def predicted(epochs: int, db: Path, env: dict[str, str]) -> tuple[str, float, float]:
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                        "--", sys.executable, str(SCRIPT), "--epochs", str(epochs)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    first = (d.get("advice") or [{}])[0]
    return d["verdict"], d["throughput"], first.get("predicted_throughput") or float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--warm", action="store_true")
    a = ap.parse_args()
    print("| pair | bare recompiling | bare one shape | bare ratio | monitor run: verdict, "
          "throughput → predicted | predicted ratio | predicted / bare |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            before = bare(a.epochs, cache(tmp, a.warm))
            verdict, rate, pred = predicted(a.epochs, Path(tmp) / f"{i}.db",
                                            cache(tmp, a.warm))
            after = bare(a.epochs, cache(tmp, a.warm), "--buckets")
            b, p = after / before, pred / rate
            print(f"| {i + 1} | {before:,.1f} | {after:,.1f} | x{b:.2f} | {verdict}, "
                  f"{rate:,.1f} → {pred:,.1f} | x{p:.2f} | {p / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
