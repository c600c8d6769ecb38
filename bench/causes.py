"""The causes real jobs starve from, each reproduced by tests/scripts/causes.py (a plain
script, no monitor imports): what `monitor run --json` says of it (the verdict's cause and
its first advice, with its prediction), and bare runs before and after the fix, interleaved
(before, after, before, after) so the box's drift falls on both alike.

    python bench/causes.py [--seconds 6] [--only tiny,startup] [--busy]

--busy adds the contention case (two other processes keep both cores busy meanwhile).
Prints one markdown row per cause; figures only, nothing is asserted (tests/test_causes.py
asserts each cause's finding).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "causes.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# cause: (kind, script args, the fix's args or None (from the advice), what the fix is);
# a case's own run length where its cause needs one (epochs of 3 s, memory over 10 s)
LONGER = {"startup": 12.0, "mem_growth": 14.0}  # (USS is read one pass in 8)
CASES = {
    "idle workers": ("idle_shards", ["--workers", "4"], ["--workers", "1"],
                     "shards >= workers (here: 1 worker does the same)"),
    "per-sample overhead": ("tiny", ["--workers", "0", "--step-ms", "1"],
                            ["--workers", "0", "--step-ms", "1", "--batched"],
                            "__getitems__ (batched fetch)"),
    "head-of-line": ("head_of_line", ["--workers", "4"], ["--workers", "4", "--any-order"],
                     "in_order=False"),
    "worker start-up": ("startup", ["--workers", "2", "--step-ms", "10"],
                        ["--workers", "2", "--step-ms", "10", "--persistent"],
                        "persistent_workers=True"),
    "open files": ("fds", ["--workers", "2"], ["--workers", "2", "--sharing", "file_system"],
                   "file_system sharing"),
    "worker memory": ("mem_growth", ["--workers", "2"], None, "bounded cache (no bare fix)"),
    "a pool in every worker": ("threads", ["--workers", "2"], ["--workers", "2", "--pool", "1"],
                               "one thread a worker"),
    "the main process's pool": ("main_threads", ["--workers", "2"],
                                ["--workers", "2", "--main-threads", "1"],
                                "torch.set_num_threads(1)"),
    "remote reads": ("remote", ["--workers", "2"], "advised", "the advised num_workers"),
    "the loop's receive": ("fields", ["--workers", "2", "--step-ms", "5"],
                           ["--workers", "2", "--step-ms", "5", "--sharing", "file_system"],
                           "file_system sharing (--workers 4: none)"),
}
BUSY = ("contention (2 busy jobs)", ("cpu_heavy", ["--workers", "0", "--step-ms", "10"],
                                     "advised", "the advised num_workers"))


def bare(kind: str, args: list[str], seconds: float) -> str:
    try:
        r = subprocess.run([sys.executable, str(SCRIPT), kind, *args, "--seconds",
                            str(seconds)], cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=seconds * 3 + 20)
    except subprocess.TimeoutExpired:
        return "hangs"
    m = re.search(r"\(\d+ batches, (\d+) samples/s\)", r.stdout)
    return f"{int(m.group(1)):,}" if r.returncode == 0 and m else f"fails ({r.returncode})"


def monitored(kind: str, args: list[str], seconds: float, db: Path) -> dict:
    """The run's JSON; a job that hangs is stopped with Ctrl-C, as a user would, and with
    SIGTERM (which `monitor run` forwards too) where Ctrl-C did not end it."""
    p = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                          "--", sys.executable, str(SCRIPT), kind, *args, "--seconds",
                          str(seconds)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, _ = p.communicate(timeout=seconds * 3 + 30)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.terminate()
            out, _ = p.communicate(timeout=120)
    lines = out.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"verdict": "?", "advice": [], "findings": []}


def row(cause: str, case: tuple, seconds: float, tmp: Path) -> str:
    kind, args, fix, what = case
    seconds = max(seconds, LONGER.get(kind, 0.0))
    d = monitored(kind, args, seconds, tmp / f"{kind}.db")
    said = ", ".join(f["cause"] for f in d.get("findings", [])) or d.get("verdict", "?")
    first = (d.get("advice") or [{}])[0]
    pred = first.get("predicted_throughput")
    advice = f"{first.get('param')}={first.get('value')}" if first else "none"
    if fix == "advised":  # the first num_workers advice (a finding's own fix may lead)
        nw = next((x for x in d.get("advice") or [] if x.get("param") == "num_workers"), None)
        fix = [*args[:0], "--workers", str(nw["value"]), *args[2:]] if nw else None
    before, after = [], []
    for _ in range(2):
        before.append(bare(kind, args, seconds))
        after.append(bare(kind, fix, seconds) if fix else "–")
    thr = d.get("throughput")
    return (f"| {cause} | `{kind} {' '.join(args)}` | {said} | {advice} | "
            f"{f'{thr:,.0f}' if thr else '–'} | {f'{pred:,.0f}' if pred else '–'} | "
            f"{' / '.join(before)} | {what}: {' / '.join(after)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--busy", action="store_true")
    a = ap.parse_args()
    # Ctrl-C reaches the reproducers as a terminal's would: started in the background of a
    # non-interactive shell this process inherits SIGINT ignored, its children would too,
    # and a hung reproducer would ignore the Ctrl-C `monitor run` forwards to it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    only = {x.strip() for x in a.only.split(",") if x.strip()}
    print("| cause | reproducer | the product named | first advice | monitored samples/s | "
          "predicted | bare before (x2) | bare after the fix (x2) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for cause, case in CASES.items():
            if not only or case[0] in only:
                print(row(cause, case, a.seconds, Path(tmp)), flush=True)
        if a.busy:
            jobs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(2)]
            try:
                print(row(*BUSY, a.seconds, Path(tmp)), flush=True)
            finally:
                for j in jobs:
                    j.kill()
                    j.wait()


if __name__ == "__main__":
    main()
