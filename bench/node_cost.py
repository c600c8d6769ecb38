"""What `monitor run` itself costs on one node of many ranks: one `monitor run` over
`torchrun --standalone --nproc-per-node K` (DDP over gloo, a tiny CPU model, 4 DataLoader
workers a rank, kept across epochs; epochs of 50 steps until SECONDS of stepping, decided
together at an epoch's end, so that "while stepping" is a steady state, as in a real job's
minutes-long epochs, not the workers' start) at each K. For each it prints `monitor run`'s
own CPU (its process: the relay, the sampler, the follow, the summary; not its children) in % of one
core per rank, over the whole run (its start and end-of-run summary included) and while the
ranks step (from the first poll that found steps to the last), that split at WARM_S of
stepping where the run stepped longer (the workers' first seconds: their memory is read
more often while it still rises, NOTE [one worker's USS a read]); the relay's lag (polling the
store every POLL_S while the ranks step: for each step, when a poll first found it stored
less its time, p50/p99, up to POLL_S high); the sampler's period held (the gaps between the
run's host samples: median and p99, against its 0.25 s); and each rank's steps stored
against the steps it took (the script prints its count).

    python bench/node_cost.py [--ranks 1,2,4,8] [--seconds 20] [--workers 4]

Figures only (issue 55's goals: under 2% of a core per rank, the p99 lag under 1 s, every
step stored). The box is shared: compare rows of one invocation.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from monitor.store import Store  # noqa: E402

POLL_S = 0.25  # the lag's resolution
WARM_S = 20.0  # seconds of stepping reported apart where a run steps longer
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
SCRIPT = """import os, sys, time, torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Samples(Dataset):  # one epoch of EPOCH batches (whole epochs: an epoch's last step
    def __len__(self):     # is recorded at its end; a loop left mid-epoch drops its last)
        return 50 * 32
    def __getitem__(self, i):
        x = torch.randn(64)
        for _ in range(20):  # a little work a sample
            x = torch.tanh(x)
        return x, x.sum()

def main():
    seconds, workers = float(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(), batch_size=32, num_workers=workers,
                        persistent_workers=True)  # (a real epoch is minutes: no churn)
    taken, start = 0, None
    while True:  # epochs until `seconds` of stepping, decided together at an epoch's end
        for x, y in loader:
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            taken += 1
            start = start or time.monotonic()
        done = torch.tensor([float(time.monotonic() - start >= seconds)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item():
            break
    os.write(1, f"taken {dist.get_rank()} {taken}\\n".encode())  # one write: ranks share a pipe
    dist.destroy_process_group()

main()
"""


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def one(ranks: int, seconds: float, workers: int, script: Path, tmp: Path) -> dict:
    db = tmp / f"node{ranks}.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp)}  # (torchrun leaves its torchelastic_* folder there)
    p = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--no-live", "--db", str(db),
                          "--json", "--", TORCHRUN, "--standalone",
                          f"--nproc-per-node={ranks}", str(script), str(seconds), str(workers)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    me = psutil.Process(p.pid)
    lags: list[float] = []
    seen: set[tuple[int, int]] = set()
    cpu, t0, since = 0.0, time.monotonic(), 0.0
    stepping: list[tuple[float, float]] = []  # (time, its CPU) at polls that found new steps
    while p.poll() is None:
        try:
            c = me.cpu_times()
            cpu = c.user + c.system  # its own threads, not its children
        except psutil.Error:
            break
        fresh = len(seen)
        if db.exists():  # each step's lag: when a poll first saw it stored, less its time
            try:
                st = Store(db)
                rows = st.db.conn().execute(
                    "SELECT rank, step, ts FROM steps WHERE run_id = 1 AND ts > ?",
                    (since - 10.0,)).fetchall()
                st.close()
                now = time.time()
                for rank, step, ts in rows:
                    if (rank, step) not in seen:
                        seen.add((rank, step))
                        lags.append(now - ts)
                        since = max(since, ts)
            except Exception:  # (the store being made)
                pass
        if len(seen) > fresh:
            stepping.append((time.monotonic(), cpu))
        time.sleep(POLL_S)
    wall = time.monotonic() - t0
    out, err = p.communicate(timeout=60)
    # (8 ranks print to one pipe: their lines may run into each other)
    taken = {int(r): int(n) for r, n in re.findall(r"taken (\d+) (\d+)", out)}
    st = Store(db)
    stored = st.steps(1)
    per_rank = stored.groupby("rank").size().to_dict() if not stored.empty else {}
    host = st.host_samples(0.0)
    host = host[host["run_id"] == 1] if not host.empty else host
    gaps = []
    if not host.empty:
        ts = sorted(set(host["ts"].astype(float)))
        gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    last = [ln for ln in out.splitlines() if ln.startswith("{")]
    (ta, ca), (tb, cb) = (stepping[0], stepping[-1]) if stepping else ((0, 0), (0, 0))
    # (the poll nearest WARM_S into the stepping, where WARM_S more followed it)
    tw, cw = min(stepping, key=lambda x: abs(x[0] - ta - WARM_S)) if stepping else (0, 0)
    split = tb - ta >= 2 * WARM_S and tw > ta
    return {"ranks": ranks, "rc": p.returncode, "wall_s": wall, "cpu_s": cpu,
            "core_pct_per_rank": 100.0 * cpu / wall / ranks,
            "stepping_pct_per_rank": 100.0 * (cb - ca) / (tb - ta) / ranks if tb > ta
            else float("nan"),
            "first_pct_per_rank": 100.0 * (cw - ca) / (tw - ta) / ranks if split
            else float("nan"),
            "after_pct_per_rank": 100.0 * (cb - cw) / (tb - tw) / ranks if split
            else float("nan"),
            "lag_p50": pct(lags, 0.5), "lag_p99": pct(lags, 0.99),
            "period_median": statistics.median(gaps) if gaps else float("nan"),
            "period_p99": pct(gaps, 0.99),
            "stored": {int(k): int(v) for k, v in per_rank.items()}, "taken": taken,
            "verdict": json.loads(last[-1]).get("verdict") if last else None,
            "err": err[-800:] if p.returncode else ""}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "ddp_tiny.py"
        script.write_text(SCRIPT)
        for k in (int(x) for x in a.ranks.split(",")):
            r = one(k, a.seconds, a.workers, script, Path(d))
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"\n{a.workers} workers a rank, epochs of 50 steps for {a.seconds:g} s of stepping\n")
    print(f"| ranks | wall s | monitor run CPU s | % of a core per rank: whole run / while "
          f"stepping | ... while stepping: its first {WARM_S:g} s / after | relay lag p50 / "
          "p99 s | sampler period median / p99 s | steps stored / taken |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        whole = all(r["stored"].get(k) == v for k, v in r["taken"].items()) and \
            len(r["taken"]) == r["ranks"]
        split = "–" if r["first_pct_per_rank"] != r["first_pct_per_rank"] else \
            f"{r['first_pct_per_rank']:.2f}% / {r['after_pct_per_rank']:.2f}%"
        print(f"| {r['ranks']} | {r['wall_s']:.1f} | {r['cpu_s']:.2f} | "
              f"{r['core_pct_per_rank']:.2f}% / {r['stepping_pct_per_rank']:.2f}% | {split} | "
              f"{r['lag_p50']:.2f} / {r['lag_p99']:.2f} | "
              f"{r['period_median']:.3f} / {r['period_p99']:.3f} | "
              f"{sum(r['stored'].values())} / {sum(r['taken'].values())}"
              f"{'' if whole else ' (not all)'} |")


if __name__ == "__main__":
    main()
