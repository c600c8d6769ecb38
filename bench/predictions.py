"""Do the advice's predictions hold beside other jobs? For each cell (a loader kind, a
num_workers, the neighbours it shares the box with) it records the loop under
`monitor run --json`, takes the first num_workers advice with its predicted speed-up and
range, then measures that change bare, in interleaved pairs (before, after, before, after)
beside the same neighbours. A cell is a hit when the measured speed-up is within +-30% of
the predicted one, or when the advice says it cannot promise a gain here (its range spans
none) and the bare change gained less than 30%.

    python bench/predictions.py [--kinds cpu,storage,per-sample] [--workers 0,2,4]
        [--neighbours quiet,same,sessions,cgroup,quota] [--seconds 6] [--pairs 2]
        [--repeat 1]  (monitored runs a cell: do identical runs say the same?)

Neighbours (all: a "job" of two busy processes, and one process busy 2 s, idle 2 s):
- quiet: none
- same: started by this script, in its own session (one scheduling group with the loop)
- sessions: each in a session of its own (`setsid`), as another user's job is: with
  autogroups on (/proc/sys/kernel/sched_autogroup_enabled) each is a scheduling group
- cgroup: in a cgroup of their own with cpu.shares 2048 (cgroup v1 `cpu`; v2 cpu.weight 200)
- quota: the sessions' neighbours, and the loop itself (monitored and bare) in a cgroup
  with a quota of 1.5 CPUs
The loop is bench/repro/loader.py. Figures only; nothing is asserted.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "bench" / "repro" / "loader.py"
CG_V1 = Path("/sys/fs/cgroup/cpu")
CG_V2 = Path("/sys/fs/cgroup")
BUSY = "while True: pass\n"
JOB = ("import subprocess, sys\nps = [subprocess.Popen([sys.executable, '-c', "
       f"{BUSY!r}]) for _ in range(2)]\nfor p in ps:\n    p.wait()\n")  # two busy processes
TOGGLE = ("import time\nwhile True:\n    t = time.monotonic() + 2\n"
          "    while time.monotonic() < t: pass\n    time.sleep(2)\n")
TOLERANCE = 0.30


def _cgroup(name: str, settings: dict[str, str]) -> Path | None:
    """A cpu cgroup of ours (v1, else v2), its settings written; None where none can be."""
    for base in (CG_V1, CG_V2):
        if not (base / "cgroup.procs").exists():
            continue
        path = base / name
        try:
            path.mkdir(exist_ok=True)
            for k, v in settings.items():
                f = path / k
                if f.exists():
                    f.write_text(v)
            return path
        except OSError:
            continue
    return None


def _join(cg: Path | None) -> list[str]:
    """A shell prefix that moves the command into `cg` before it runs."""
    return [] if cg is None else ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"]


class Neighbours:
    def __init__(self, kind: str) -> None:
        self.kind, self.procs = kind, []
        self.job_cg: Path | None = None
        self.cg: Path | None = None
        if kind == "cgroup":
            self.cg = _cgroup("sm-bench-neighbours", {"cpu.shares": "2048", "cpu.weight": "200"})
        if kind == "quota":
            self.job_cg = _cgroup("sm-bench-job", {"cpu.cfs_period_us": "100000",
                                                   "cpu.cfs_quota_us": "150000",
                                                   "cpu.max": "150000 100000"})

    def __enter__(self) -> Neighbours:
        if self.kind == "quiet":
            return self
        # "same": this script's session (its autogroup), in a process group of their own
        # (to be killed whole); else each job in a session of its own
        where = {"process_group": 0} if self.kind == "same" else {"start_new_session": True}
        for code in (JOB, TOGGLE):
            self.procs.append(subprocess.Popen(
                [*_join(self.cg), sys.executable, "-c", code], **where))
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def bare(args: argparse.Namespace, kind: str, workers: int, job: Path | None) -> float:
    r = subprocess.run([*_join(job), sys.executable, str(REPRO), "--kind", kind, "--workers",
                        str(workers), "--seconds", str(args.seconds)],
                       capture_output=True, text=True, check=True, cwd=ROOT)
    return float(json.loads(r.stdout.strip().splitlines()[-1])["throughput"])


def monitored(args: argparse.Namespace, kind: str, workers: int, job: Path | None,
              db: Path) -> dict:
    """One monitored run into `db`: a cell's identical runs share one store, as a user's
    runs share the default one (NOTE [identical runs])."""
    r = subprocess.run([*_join(job), sys.executable, "-m", "monitor", "run", "--db",
                        str(db), "--json", "--no-live", "--", sys.executable,
                        str(REPRO), "--kind", kind, "--workers", str(workers),
                        "--seconds", str(args.seconds)],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def said(d: dict) -> str:
    """A run's verdict and its num_workers advice, as a user reads them."""
    adv = next((a for a in d.get("advice") or [] if a["param"] == "num_workers"), None)
    return f"{d.get('verdict')}" + (f" ({adv['value']} workers)" if adv else "")


def cell(args: argparse.Namespace, kind: str, workers: int, hood: Neighbours) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "p.db"
        d = monitored(args, kind, workers, hood.job_cg, db)
        again = [said(monitored(args, kind, workers, hood.job_cg, db))
                 for _ in range(args.repeat - 1)]
    adv = next((a for a in d.get("advice") or [] if a["param"] == "num_workers"), None)
    out = {"kind": kind, "workers": workers, "neighbours": hood.kind,
           "verdict": d.get("verdict"), "limit": (d.get("bound") or {}).get("limit"),
           "throughput": d.get("throughput"), "advice": None, "runs": [said(d), *again]}
    if adv is None:
        return out
    base = adv.get("base_throughput") or d["throughput"] or float("nan")
    pred = adv.get("predicted_throughput")
    lo, hi = adv.get("predicted_low"), adv.get("predicted_high")
    before, after = [], []
    for _ in range(args.pairs):
        before.append(bare(args, kind, workers, hood.job_cg))
        after.append(bare(args, kind, int(adv["value"]), hood.job_cg))
    measured = statistics.mean(after) / statistics.mean(before)
    predicted = pred / base if pred else None
    declined = bool(adv.get("uncertain"))
    if declined:
        hit = measured < 1 + TOLERANCE
    else:
        hit = predicted is not None and abs(measured / predicted - 1) <= TOLERANCE
    return {**out, "advice": f"{workers} → {adv['value']}", "limit_then": adv.get("limit"),
            "predicted": predicted, "range": (lo / base if lo else None,
                                              hi / base if hi else None),
            "declined": declined, "before": before, "after": after, "measured": measured,
            "hit": hit}


def line(c: dict) -> str:
    runs = c["runs"]
    repeated = "" if len(runs) < 2 else (
        f"\n    {len(runs)} identical runs: " + ("the same: " if len(set(runs)) == 1
                                                 else "DIFFER: ") + "; ".join(runs))
    if c["advice"] is None:
        return (f"{c['kind']:<11}{c['workers']:>3}  {c['neighbours']:<9}{c['verdict']:<22}"
                f"{c['limit'] or '-':<14}no num_workers advice{repeated}")
    lo, hi = c["range"]
    rng = f"{lo:.2f}-{hi:.2f}" if lo and hi else "-"
    pred = "cannot promise" if c["declined"] else f"x{c['predicted']:.2f}"
    return (f"{c['kind']:<11}{c['workers']:>3}  {c['neighbours']:<9}{c['verdict']:<22}"
            f"{c['limit_then'] or '-':<14}{c['advice']:<8}{pred:>15} {rng:>11}  "
            f"{' '.join(f'{x:,.0f}' for x in c['before'])} → "
            f"{' '.join(f'{x:,.0f}' for x in c['after'])}  x{c['measured']:.2f}  "
            f"{'hit' if c['hit'] else 'MISS'}{repeated}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="cpu,storage,per-sample")
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--neighbours", default="quiet,same,sessions,cgroup,quota")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="monitored runs a cell (their verdicts and advice compared)")
    args = ap.parse_args()
    print(f"{'kind':<11}{'nw':>3}  {'beside':<9}{'verdict':<22}{'limit then':<14}"
          f"{'advice':<8}{'predicted':>15} {'range':>11}  bare before → after  measured")
    cells = []
    for hood_kind in args.neighbours.split(","):
        with Neighbours(hood_kind) as hood:
            for kind in args.kinds.split(","):
                for nw in (int(x) for x in args.workers.split(",")):
                    try:
                        c = cell(args, kind, nw, hood)
                    except (RuntimeError, subprocess.CalledProcessError) as exc:
                        print(f"{kind} {nw} {hood_kind}: failed: {exc}", flush=True)
                        continue
                    cells.append(c)
                    print(line(c), flush=True)
    judged = [c for c in cells if c["advice"] is not None]
    hits = sum(c["hit"] for c in judged)
    print(f"\nhit rate: {hits}/{len(judged)} cells with num_workers advice within "
          f"±{TOLERANCE:.0%} (or declined and no gain); {len(cells) - len(judged)} cells "
          "without such advice")
    if args.repeat > 1:
        same = sum(len(set(c["runs"])) == 1 for c in cells)
        print(f"identical runs: the same verdict and advice in {same} of {len(cells)} cells")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
