"""Where the suite's CPU goes: runs pytest (the arguments after `--`, default the whole
suite as `make test` runs it) with a plugin that charges each test the CPU its xdist worker
and the processes it waited for used from its setup to its teardown (getrusage: SELF +
CHILDREN; a process a test started and nobody waited for is not counted), then prints the
tests and files that cost most (and of each test's CPU, what its pytest worker used itself),
the total against the suite's wall time and the CPU of the whole process tree (workers'
collection, shared browsers and servers included), and each xdist worker's busy time and
when it ran out of tests (a tail where one worker still runs is wall time no CPU saving
shortens), and the CPU by kind of process (the pytest run's descendants, read from /proc every
0.25 s: a browser, a server or a daemon that no test waits for counted too; a process's last
0.25 s, and a process that lived less, can be missed).

    python bench/suite_cpu.py [--top 40] [-- pytest args...]

Figures only: the house's goal is the whole suite within 10 minutes beside one busy core,
and on two cores that is a CPU budget, not a wall-clock one.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = '''
import json, os, resource, time
import pytest

def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (s0, c0), w0 = _cpu(), time.time()
    yield
    s1, c1 = _cpu()
    with open(os.environ["SUITE_CPU_OUT"], "a") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu": s1 - s0 + c1 - c0, "own": s1 - s0,
                            "start": w0,
                            "end": time.time(),
                            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}) + "\\n")
'''


def box_busy() -> float:
    """CPU-seconds the whole machine has spent busy since boot (/proc/stat: all but idle and
    iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


# what a process is, from its command line (first match wins)
KINDS = [
    ("pytest worker", r"exec\(eval\(sys\.stdin"),
    ("Chromium", r"chrom"),
    ("Playwright's driver", r"playwright/driver"),
    ("Streamlit server", r"streamlit run|-m monitor dashboard"),
    ("Prometheus, promtool", r"prometheus|promtool"),
    ("MLflow server", r"mlflow server|gunicorn|uvicorn"),
    ("torchrun's agent", r"torchrun|torch\.distributed\.run"),
    ("monitor run (launcher)", r"-m monitor run|monitor/__main__\.py run"),
    ("monitor, other commands", r"-m monitor "),
    ("sampler", r"collector\.py|monitor\.sampling"),
    ("managed workload (spawned)", r"workloads\.runner|workloads/runner\.py"),
    ("managed workload (forked) and its workers", r"workloads\.forkserver"),
    ("user workload check", r"workloads\.user"),
    ("Ray", r"/ray/|ray::|raylet|gcs_server"),
    ("the tests' busy loops", r"while True|range\(3 \* 10\*\*7\)"),
    ("a test's script and its workers", r"tests/scripts/|examples/|\.venv-vision/bin/yolo"),
    ("pytest", r"-m pytest"),
]


class Tree:
    """The CPU of every descendant of `root` (its user + system time, /proc/PID/stat) by kind,
    read every `every` s: the last reading of each process is what it used."""

    def __init__(self, root: int, every: float = 0.25) -> None:
        self.every = every
        self.ours: set[int] = {root}
        self.seen: dict[tuple[int, int], list] = {}  # (pid, start) -> [kind, cpu]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="suite-cpu-tree", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        hz = os.sysconf("SC_CLK_TCK")
        nxt = time.monotonic()
        while not self.stop.is_set():
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open(f"/proc/{d}/stat") as f:
                        st = f.read()
                    rest = st[st.rfind(")") + 2:].split()
                    pid, ppid, start = int(d), int(rest[1]), int(rest[19])
                    if pid not in self.ours and ppid not in self.ours:
                        continue
                    self.ours.add(pid)
                    row = self.seen.get((pid, start))
                    if row is None:
                        with open(f"/proc/{d}/cmdline", "rb") as f:
                            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                        name = st[st.find("(") + 1:st.rfind(")")]
                        row = self.seen[(pid, start)] = [kind(name + " " + cmd), 0.0]
                    row[1] = (int(rest[11]) + int(rest[12])) / hz
                except (OSError, ValueError, IndexError):
                    continue
            nxt += self.every
            self.stop.wait(max(0.0, nxt - time.monotonic()))

    def by_kind(self) -> list[tuple[str, int, float]]:
        self.stop.set()
        self.thread.join()
        out: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for k, cpu in self.seen.values():
            out[k][0] += 1
            out[k][1] += cpu
        return sorted(((k, n, c) for k, (n, c) in out.items()), key=lambda x: -x[2])


def kind(cmd: str) -> str:
    for name, pattern in KINDS:
        if re.search(pattern, cmd):
            return name
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("pytest", nargs="*")
    a = ap.parse_args()
    args = a.pytest or ["-n", "4", "--dist", "loadgroup"]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "suite_cpu_plugin.py").write_text(PLUGIN)
        out = Path(d) / "cpu.jsonl"
        env = {**os.environ, "SUITE_CPU_OUT": str(out), "PYTHONDONTWRITEBYTECODE": "",
               "PYTHONPATH": os.pathsep.join([d, str(ROOT)])}
        box0, t0, started = box_busy(), time.monotonic(), time.time()
        p = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", "-q",
                              *args], cwd=ROOT, env=env)
        tree_by_kind = Tree(p.pid)
        p.wait()
        kinds = tree_by_kind.by_kind()
        wall = time.monotonic() - t0
        tree, box = resource.getrusage(resource.RUSAGE_CHILDREN), box_busy() - box0
        rows = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    total = sum(r["cpu"] for r in rows)
    per_file: dict[str, float] = defaultdict(float)
    for row in rows:
        per_file[row["test"].split("::")[0]] += row["cpu"]
    print(f"\npytest exit {p.returncode}; {len(rows)} tests; {total:.0f} CPU-s charged to "
          f"tests in {wall:.0f} s of wall\n")
    own = sum(r["own"] for r in rows)
    print(f"of which {own:.0f} CPU-s in the pytest workers themselves (a test's own code, "
          "its fixtures, threads and in-process runs), the rest in processes they waited for\n")
    print("| test | CPU s | in the worker | wall s |\n|---|---|---|---|")
    for row in sorted(rows, key=lambda x: -x["cpu"])[:a.top]:
        print(f"| {row['test']} | {row['cpu']:.1f} | {row['own']:.1f} | "
              f"{row['end'] - row['start']:.0f} |")
    print("\n| file | CPU s | share |\n|---|---|---|")
    for f, c in sorted(per_file.items(), key=lambda kv: -kv[1]):
        print(f"| {f} | {c:.0f} | {100 * c / total:.1f}% |")
    print(f"\nthe whole process tree: {tree.ru_utime + tree.ru_stime:.0f} CPU-s in {wall:.0f} s; "
          f"the box's CPUs were busy {box:.0f} CPU-s meanwhile (every process: a neighbour's "
          "too, and daemons the tests' processes left to init, which no wait counts)")
    seen = sum(c for _, _, c in kinds)
    print("\n| kind of process (the pytest run's descendants) | processes | CPU s | share | "
          "per process, s |\n|---|---|---|---|---|")
    for k, n, c in kinds:
        print(f"| {k} | {n} | {c:.0f} | {100 * c / max(seen, 1e-9):.1f}% | {c / n:.2f} |")
    print(f"| all | {sum(n for _, n, _ in kinds)} | {seen:.0f} | | |")
    workers: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        workers[row["worker"]].append(row)
    print("\n| worker | tests | in tests, s | CPU s | last test ended at, s | its last test |"
          "\n|---|---|---|---|---|---|")
    for w, rs in sorted(workers.items(), key=lambda kv: max(x["end"] for x in kv[1])):
        last = max(rs, key=lambda x: x["end"])
        print(f"| {w} | {len(rs)} | {sum(x['end'] - x['start'] for x in rs):.0f} | "
              f"{sum(x['cpu'] for x in rs):.0f} | {last['end'] - started:.0f} | "
              f"{last['test']} ({last['end'] - last['start']:.0f} s) |")


if __name__ == "__main__":
    main()
