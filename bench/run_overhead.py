"""What `monitor run` adds around a script: from its own start to the script's first line,
and from the script's last line to its own exit, against the same script run bare, in
interleaved pairs. The script imports nothing (its first line is its first statement), so
the start figure is `monitor run`'s own start-up and the probe's injection, and the end
figure the end-of-run summary.

    python bench/run_overhead.py [--pairs 5] [--steps 0]

`--steps N`: the script iterates a DataLoader of N batches (torch imported: a run with
steps, whose summary is judged). Figures only (issue 55: the script started within 0.3 s,
`monitor run` back within 0.5 s of the script's exit for a short run).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = """import time, sys
print("first", time.time(), flush=True)
n = int(sys.argv[1])
if n:
    import torch
    from torch.utils.data import DataLoader
    for _ in DataLoader(list(range(n * 8)), batch_size=8):
        time.sleep(0.01)
print("last", time.time(), flush=True)
"""


def once(script: Path, steps: int, monitored: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        wrap = [sys.executable, "-m", "monitor", "run", "--no-live", "--db", f"{d}/o.db",
                "--"] if monitored else []
        t0 = time.time()
        r = subprocess.run([*wrap, sys.executable, str(script), str(steps)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        t1 = time.time()
    marks = dict(ln.split() for ln in r.stdout.splitlines() if ln.startswith(("first", "last")))
    return float(marks["first"]) - t0, t1 - float(marks["last"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "short.py"
        script.write_text(SCRIPT)
        rows = []
        for i in range(a.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {m: once(script, a.steps, m) for m in order}
            rows.append((got[False], got[True]))
            (bs, be), (ms, me) = got[False], got[True]
            print(f"pair {i + 1}: to the first line bare {bs:.3f} s, monitored {ms:.3f} s "
                  f"(+{ms - bs:.3f}); after the last line bare {be:.3f} s, monitored "
                  f"{me:.3f} s (+{me - be:.3f})", flush=True)
    start = statistics.median(m[0] - b[0] for b, m in rows)
    end = statistics.median(m[1] - b[1] for b, m in rows)
    print(f"median added: {start:.3f} s before the script's first line, {end:.3f} s after "
          f"its last ({a.pairs} pairs, {a.steps} steps)")


if __name__ == "__main__":
    main()
