"""The command line's flags and help texts (monitor/cli/main.py parses with these)."""
from __future__ import annotations

import argparse
from typing import Any

from monitor.config import LOADER_SETTINGS as SWEEP_PARAMS
from monitor.config import MODEL_SIZES, PRESETS, SETTING, SETTINGS
from monitor.manage import outputs
from monitor.store import ENV_VAR, default_path
from monitor.thresholds import (
    BUDGET_ENV,
    KNEE_SHARE,
    MAX_REGRESSION_PCT,
    MIN_STEP_GAIN,
    WARMUP_FRACTION,
    WARMUP_MAX_S,
)


def _db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None,
                   help=f"SQLite store (default: ${ENV_VAR} or {default_path()})")


def _workload_options() -> argparse.ArgumentParser:
    w = argparse.ArgumentParser(add_help=False)
    w.add_argument("--preset", choices=PRESETS, default="starving",
                   help="synthetic workload (default: starving)")
    w.add_argument("--workload", metavar="SPEC", default=None,
                   help="your own dataset instead of a preset: path/to/file.py:callable or "
                        "package.module:callable returning a Dataset (or a dict with "
                        "'dataset', optional 'collate_fn', 'model_step', loader defaults)")
    w.add_argument("--step-time-ms", type=float, default=None,
                   help="device time per step: the simulated accelerator's, or the CUDA "
                        "model's target with --model-size auto (default: the preset's)")
    w.add_argument("--model-size", choices=MODEL_SIZES, default="auto",
                   help="CUDA model: auto (default) repeats a width-64 net's pass to take about "
                        "the step time; small/medium/large are fixed widths, one pass per step "
                        "(ignored by the simulated accelerator)")
    w.add_argument("--epoch-samples", type=int, default=None,
                   help="samples per epoch (default: the preset's); short epochs show the "
                        "cost of restarting workers at every epoch")
    w.add_argument("--memory-budget-mb", type=float, default=None,
                   help="judge memory against this budget instead of the machine's memory "
                        f"(also ${BUDGET_ENV})")
    _db(w)
    w.add_argument("--json", action="store_true",
                   help="print one JSON object as the last line of stdout")
    return w


def _loader_options(p: argparse.ArgumentParser, limit: int) -> None:
    """A flag per declared loader setting (config.SETTINGS): a whole number, or a switch
    with its --no- form; unset (None) where not given, so a preset's or a user workload's
    own default stands."""
    for s in SETTINGS:
        if s.kind is bool:
            p.add_argument(s.flag, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{s.help} (default: {'on' if s.default else 'off'})")
        else:
            more = {"num_workers": f" (this machine: up to {limit})",
                    "batch_size": " (default: the preset's)"}.get(s.name, "")
            p.add_argument(s.flag, type=int, default=None, help=s.help + more)


def _measure(sub: argparse._SubParsersAction, common: argparse.ArgumentParser,
             limit: int) -> None:
    m = sub.add_parser(
        "measure", parents=[common],
        help="run a managed workload for a while and print throughput and data-wait share",
        description=(
            "Run a synthetic workload with the given DataLoader settings, record it to the "
            "store as a run, and assess its steady state (the run's first "
            f"{WARMUP_FRACTION:.0%}, at most {WARMUP_MAX_S:g} s, is discarded as warm-up): "
            "throughput, data-wait share, device busy, "
            "the verdict, the bound and advice. Without CUDA the accelerator is simulated."
        ),
    )
    _loader_options(m, limit)
    m.add_argument("--seconds", type=float, default=10.0,
                   help="how long to measure after the first batch (default 10)")


def _sweep(sub: argparse._SubParsersAction, common: argparse.ArgumentParser,
           limit: int) -> None:
    s = sub.add_parser(
        "sweep", parents=[common],
        help="measure every configuration of a grid and name the best and the knee",
        description=(
            "Run each configuration of the grid as its own run: warm-up discarded, the steady "
            "state assessed as measure does, its throughput over the whole window and the "
            "spread over its parts, with data-wait share, device busy and peak memory. "
            "Configurations predicted not to fit in memory are skipped with the reason. The "
            f"knee is the cheapest configuration within {1 - KNEE_SHARE:.0%} of the best. "
            "Ctrl-C stops after "
            "cleaning up; finished results are kept."
        ),
    )
    _loader_options(s, limit)
    s.add_argument("--param", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a swept setting, repeatable: num_workers=0,1,2,4 "
                        "prefetch_factor=1,2,4 batch_size=32,64 pin_memory=off,on "
                        "in_order=on,off (default: num_workers=0,1,2,...,3x cores)")
    s.add_argument("--seconds-per-config", type=float, default=8.0,
                   help="measured seconds per configuration after its first batch (default 8)")
    s.add_argument("--windows", type=int, default=3,
                   help="parts the steady state is cut into for the spread (3)")
    s.add_argument("--csv", metavar="FILE", default=None, help="also write the results as CSV")


def _tune(sub: argparse._SubParsersAction, common: argparse.ArgumentParser,
          limit: int) -> None:
    t = sub.add_parser(
        "tune", parents=[common],
        help="adaptive search: near the grid's best in a fraction of its time",
        description=(
            "Measure the starting settings, jump to the bound model's predicted knee, then "
            "step num_workers (and prefetch_factor once) until no step gains "
            f"{MIN_STEP_GAIN:.0%}. Each "
            "configuration is a run in the store."
        ),
    )
    _loader_options(t, limit)
    t.add_argument("--seconds-per-config", type=float, default=8.0,
                   help="measured seconds per configuration (default 8)")
    t.add_argument("--budget-seconds", type=float, default=None,
                   help="stop trying new configurations after this long")
    t.add_argument("--max-workers", type=int, default=None,
                   help=f"largest num_workers to try (default {limit}: 3x usable cores)")


def _run(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "run", help="run your own training script with the probe injected",
        description=(
            "Run a training script unmodified (python -m monitor run -- python train.py "
            "ARGS): the probe times next() on the training loader (the one Lightning's fit "
            "loop or the HF Trainer iterates; in a plain loop the first DataLoader iterated; "
            "the run's events say which it follows and why), records epochs and worker "
            "PIDs, and applies loader changes requested from the page at the next epoch. "
            "The script's output, exit code and signals pass through."
        ),
    )
    r.add_argument("--name", default=None, help="run name (default: the script's file name)")
    _db(r)
    outputs.add_flags(r)  # --metrics-port, --live, ...: monitor/manage/outputs.py
    r.add_argument("--autotune", action="store_true",
                   help="tune the script's loader by itself, epoch by epoch: measure, try the "
                        "next setting (applied at the next iter(loader)), keep it only if it "
                        "pays beyond the noise, stop when nothing is predicted to gain "
                        f"{MIN_STEP_GAIN:.0%}%")
    r.add_argument("--autotune-every-steps", type=int, default=None, metavar="N",
                   help="with --autotune, judge every N steps and apply a change at a step "
                        "boundary, without waiting for the epoch (for epochs of hours): only "
                        "for a map-style dataset with a batch sampler, whose epoch order is "
                        "then drawn at iter(loader) and resumed after the change; other "
                        "loaders wait for the epoch, and the run says why")
    r.add_argument("--json", action="store_true",
                   help="after the script ends, print the summary (as measure --json) as the "
                        "last line of stdout")
    r.add_argument("--phases", action=argparse.BooleanOptionalAction, default=True,
                   help="time each step's forward pass, backward pass and optimizer step "
                        "through torch's global hooks (default: on; --no-phases: off)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="-- then the command, e.g. -- python train.py --epochs 3")


def _files(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "export", help="write a run's data as CSV or Parquet files, with run.json",
        description=(
            "Write one run's steps, host samples, GPU samples, NVML utilization, events and "
            "control requests as tables, and run.json (the run, its steady-state assessment "
            "and a checksum of its steps), to OUT/run-<id>-<format>/. Nothing is left "
            "half-written: files go to a temporary folder renamed at the end."),
    )
    e.add_argument("run", metavar="RUN", help="a run id, latest, latest~1, or name:NAME")
    e.add_argument("--format", choices=("csv", "parquet"), default="csv")
    e.add_argument("--out", default=".", help="folder to write into (default: here)")
    _db(e)
    h = sub.add_parser(
        "report", help="write one self-contained HTML report of a run (opens offline)",
        description=(
            "Write RUN's report as one HTML file: the verdict and the evidence behind it, "
            "the advice with its predicted gain, the page's charts over the whole run "
            "(plotly, its JS inlined: no network needed to open it), the settings history "
            "and autotune moves, and a compare against the run before it."))
    h.add_argument("run", metavar="RUN", help="a run id, latest, latest~1, or name:NAME")
    h.add_argument("--html", default=None, metavar="FILE",
                   help="the file to write (default: run-<id>.html here)")
    _db(h)
    i = sub.add_parser(
        "import", help="load an exported run into a store (it gets a new run id)",
        description="Load a folder written by `export` into the store as a new run, after "
                    "checking its steps against the checksum in run.json.")
    i.add_argument("folder", metavar="DIR")
    _db(i)


def _compare(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "compare", help="runs side by side; exit 1 when the last is slower than the first",
        description=(
            "Compare 2-4 runs' steady states: the settings that differ, then throughput, "
            "data-wait share, device busy, peak memory and verdict with deltas against the "
            "first. A regression gate for CI: exit 1 when the last run's throughput is lower "
            "than the first's by more than --max-regression-pct and by more than the runs' "
            "noise (each steady state cut into 5 parts; 2 standard errors), exit 3 "
            "(inconclusive) when it is, but its host was busier (other processes' CPU, the "
            "loaders' CPU wait, fewer cores, another device step) so the environment explains "
            "it, exit 0 otherwise."))
    c.add_argument("runs", nargs="+", metavar="RUN",
                   help="run ids, latest, latest~1 (the one before), or name:NAME")
    c.add_argument("--max-regression-pct", type=float, default=MAX_REGRESSION_PCT)
    c.add_argument("--strict", action="store_true",
                   help="an inconclusive comparison (a busier host) fails too: exit 1")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    _db(c)
    g = sub.add_parser(
        "gc", help="remove old runs' rows and vacuum the store (never a running run)",
        description="Remove the runs (and their steps, samples, events) older than "
                    "--keep-days, or the oldest until the store is under --max-mb; then "
                    "vacuum. A running run is never removed.")
    g.add_argument("--keep-days", type=float, default=None)
    g.add_argument("--max-mb", type=float, default=None)
    _db(g)


def _dashboard(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "dashboard", help="serve the page on 127.0.0.1 (the same page as make run)",
        description="Serve the dashboard. With --watch it only watches: it starts no demo "
                    "workload of its own, so a training job it is opened on keeps its cores "
                    "(use it beside `starvation-monitor run -- python train.py`).")
    d.add_argument("--port", type=int, default=8501)
    d.add_argument("--address", default="127.0.0.1",
                   help="the address to bind (default 127.0.0.1; 0.0.0.0 exposes the page "
                        "to your network)")
    d.add_argument("--watch", action="store_true",
                   help="start no workload: watch the runs recorded in the store")
    d.add_argument("--workload", default=None, metavar="PATH.py:CALLABLE",
                   help="your dataset for the page's managed workload")
    d.add_argument("--metrics-port", type=int, default=None,
                   help="also serve Prometheus /metrics on this port")
    d.add_argument("--prometheus", default=None, metavar="URL",
                   help="a Prometheus that scrapes every node's exporter (its base URL, e.g. "
                        "http://127.0.0.1:9090): the Job tab shows the whole job from it")
    _db(d)


def _doctor(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "doctor", help="check the environment a training job will run in",
        description="Check torch and its CUDA, NVML and GPM, /dev/shm, ulimit -u and -n, the "
                    "cgroup's CPU and memory limits, /proc schedstat and io, and the store's "
                    "folder; measure what the CPUs do together (SMT, shared vCPUs) for the "
                    "advice; each line says what to do. Exit 1 when a check fails.")
    d.add_argument("--python", default=None,
                   help="the training environment's interpreter (default: this one)")
    d.add_argument("--no-capacity", action="store_true",
                   help="skip measuring what the CPUs do together (1.2 s of every CPU)")
    g = d.add_argument_group("a loader to check against /dev/shm and ulimit -n")
    g.add_argument("--batch-mb", type=float, default=None, help="one batch's size in MB")
    g.add_argument("--tensors", type=int, default=None, help="tensors in one batch")
    g.add_argument("--num-workers", type=int, default=None)
    g.add_argument("--prefetch-factor", type=int, default=None)
    _db(d)


def build_parser(limit: int) -> argparse.ArgumentParser:
    """The whole parser; `limit` is this machine's num_workers limit (for the help)."""
    p = argparse.ArgumentParser(
        prog="starvation-monitor",
        description="Starvation Monitor: is the GPU starved by its input pipeline?",
    )
    sub = p.add_subparsers(dest="command", required=True)
    common = _workload_options()
    _measure(sub, common, limit)
    _dashboard(sub)
    _doctor(sub)
    _sweep(sub, common, limit)
    _tune(sub, common, limit)
    _run(sub)
    _files(sub)
    _compare(sub)
    return p


def parse_param(text: str) -> tuple[str, list[Any]]:
    """'num_workers=0,1,2' -> ('num_workers', [0, 1, 2]); booleans as on/off/true/false."""
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not values.strip():
        raise ValueError(f"--param {text!r}: write NAME=V1,V2,... e.g. num_workers=0,1,2,4")
    if name not in SWEEP_PARAMS:
        raise ValueError(f"--param {name!r}: sweepable are {', '.join(SWEEP_PARAMS)}")
    try:
        out = [SETTING[name].parse(v) for v in values.split(",")]
    except ValueError as exc:
        raise ValueError(f"--param {exc}") from None
    return name, list(dict.fromkeys(out))
