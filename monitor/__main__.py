"""Command line: python -m monitor {measure, sweep, tune} ...

measure: run a managed workload without the UI, record it to the store, print a summary.
sweep:   measure every configuration of a grid; print results, the best and the knee.
tune:    adaptive search for a configuration near the grid's best, in a fraction of its time.
"""
from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
from typing import Any

from monitor.config import MODEL_SIZES, PRESETS, ConfigError, LoaderConfig, max_workers
from monitor.diagnosis import BUDGET_ENV
from monitor.store import ENV_VAR, Store, default_path


def _workload_options() -> argparse.ArgumentParser:
    w = argparse.ArgumentParser(add_help=False)
    w.add_argument("--preset", choices=PRESETS, default="starving",
                   help="synthetic workload (default: starving)")
    w.add_argument("--workload", metavar="SPEC", default=None,
                   help="your own dataset instead of a preset: path/to/file.py:callable or "
                        "package.module:callable returning a Dataset (or a dict with "
                        "'dataset', optional 'collate_fn', 'model_step', loader defaults)")
    w.add_argument("--batch-size", type=int, default=None,
                   help="samples per batch (default: the preset's)")
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
    w.add_argument("--db", default=None,
                   help=f"SQLite store (default: ${ENV_VAR} or {default_path()})")
    w.add_argument("--json", action="store_true",
                   help="print one JSON object as the last line of stdout")
    return w


def _loader_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-workers", type=int, default=None,
                   help=f"DataLoader worker processes; 0 (the default) loads in the main "
                        f"process (this machine: up to {max_workers()} on the slider)")
    p.add_argument("--prefetch-factor", type=int, default=None,
                   help="batches loaded ahead per worker (needs --num-workers >= 1; default 2)")
    p.add_argument("--pin-memory", action="store_true",
                   help="copy batches into page-locked memory (faster host-to-GPU copies)")
    p.add_argument("--persistent-workers", action="store_true",
                   help="keep workers alive between epochs (needs --num-workers >= 1)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m monitor",
        description="Starvation Monitor: is the GPU starved by its input pipeline?",
    )
    sub = p.add_subparsers(dest="command", required=True)
    common = _workload_options()
    m = sub.add_parser(
        "measure", parents=[common],
        help="run a managed workload for a while and print throughput and data-wait share",
        description=(
            "Run a synthetic workload with the given DataLoader settings, record it to the "
            "store as a run, and summarise its steady state (the first fifth of the run, at "
            "most 2 s, is discarded as warm-up): throughput, data-wait share, device busy, "
            "the verdict, the bound and advice. Without CUDA the accelerator is simulated."
        ),
    )
    _loader_options(m)
    m.add_argument("--seconds", type=float, default=10.0,
                   help="how long to measure after the first batch (default 10)")
    s = sub.add_parser(
        "sweep", parents=[common],
        help="measure every configuration of a grid and name the best and the knee",
        description=(
            "Run each configuration of the grid as its own run: warm-up discarded, the steady "
            "state cut into windows, median and spread of throughput reported with data-wait "
            "share, device busy and peak RSS. Configurations predicted not to fit in memory "
            "are skipped with the reason. The knee is the cheapest configuration within 3%% "
            "of the best. Ctrl-C stops after cleaning up; finished results are kept."
        ),
    )
    _loader_options(s)
    s.add_argument("--param", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a swept setting, repeatable: num_workers=0,1,2,4 "
                        "prefetch_factor=1,2,4 batch_size=32,64 pin_memory=off,on "
                        "persistent_workers=off,on (default: num_workers=0,1,2,...,2x cores)")
    s.add_argument("--seconds-per-config", type=float, default=8.0,
                   help="measured seconds per configuration after its first batch (default 8)")
    s.add_argument("--windows", type=int, default=3,
                   help="windows the steady state is cut into for median and spread (3)")
    s.add_argument("--csv", metavar="FILE", default=None, help="also write the results as CSV")
    t = sub.add_parser(
        "tune", parents=[common],
        help="adaptive search: near the grid's best in a fraction of its time",
        description=(
            "Measure the starting settings, jump to the bound model's predicted knee, then "
            "step num_workers (and prefetch_factor once) until no step gains 3%%. Each "
            "configuration is a run in the store."
        ),
    )
    r = sub.add_parser(
        "run", help="run your own training script with the probe injected",
        description=(
            "Run a training script unmodified (python -m monitor run -- python train.py "
            "ARGS): the probe times next() on the first DataLoader it iterates, records "
            "epochs and worker PIDs, and applies loader changes requested from the page at "
            "the next epoch. The script's output, exit code and signals pass through."
        ),
    )
    r.add_argument("--name", default=None, help="run name (default: the script's file name)")
    r.add_argument("--db", default=None,
                   help=f"SQLite store (default: ${ENV_VAR} or {default_path()})")
    r.add_argument("--json", action="store_true",
                   help="after the script ends, print the summary (as measure --json) as the "
                        "last line of stdout")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="-- then the command, e.g. -- python train.py --epochs 3")
    _loader_options(t)
    t.add_argument("--seconds-per-config", type=float, default=8.0,
                   help="measured seconds per configuration (default 8)")
    t.add_argument("--budget-seconds", type=float, default=None,
                   help="stop trying new configurations after this long")
    t.add_argument("--max-workers", type=int, default=None,
                   help=f"largest num_workers to try (default {max_workers()}: 2x usable cores)")
    return p


def _config(args: argparse.Namespace) -> LoaderConfig:
    """The settings from the flags; a user workload's own defaults fill what is not given."""
    from workloads.presets import preset_batch_size

    defaults: dict = {}
    if args.workload:
        from monitor.workload_spec import check

        info = check(args.workload)
        if not info.get("ok"):
            raise ConfigError(f"workload {args.workload}: {info.get('error')}")
        defaults = info.get("defaults") or {}
        print(f"workload {args.workload}: {info.get('kind')} {info.get('dataset')}"
              + (f", {info['length']} samples" if info.get("length") else ""), file=sys.stderr)

    def pick(name: str, flag: object, fallback: object) -> object:
        given = flag is not None and flag is not False  # 0 is a value; False is "not given"
        return flag if given else defaults.get(name, fallback)

    batch = pick("batch_size", args.batch_size,
                 preset_batch_size(args.preset) if not args.workload else 32)
    kwargs = dict(
        num_workers=pick("num_workers", args.num_workers, 0), batch_size=batch,
        prefetch_factor=pick("prefetch_factor", args.prefetch_factor, None),
        pin_memory=bool(pick("pin_memory", args.pin_memory, False)),
        persistent_workers=bool(pick("persistent_workers", args.persistent_workers, False)),
        step_time_ms=args.step_time_ms, model_size=args.model_size,
        epoch_samples=args.epoch_samples,
    )
    if args.workload:
        return LoaderConfig.build(workload=args.workload, **kwargs)
    return LoaderConfig(preset=args.preset, **kwargs)


def _measure(args: argparse.Namespace, config: LoaderConfig, store: Store) -> int:
    from monitor.measure import measure

    if args.seconds <= 0:
        print("error: --seconds must be positive, e.g. --seconds 10", file=sys.stderr)
        return 2
    result = measure(store, config, args.seconds, memory_budget_mb=args.memory_budget_mb)
    s = result.summary
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"run {result.run_id} ({result.status}) on {result.accelerator}")
        print(f"  throughput        {s.throughput:.1f} samples/s over {s.steps} steps")
        print(f"  data-wait share   {s.data_wait_share:.1%}")
        print(f"  device busy mean  {s.device_busy_mean:.1%} (CV {s.device_busy_cv:.2f})")
        if result.gpu_util_mean is not None:
            cv = f"{result.gpu_util_cv:.2f}" if result.gpu_util_cv is not None else "–"
            print(f"  GPU util (NVML)   {result.gpu_util_mean:.1f}% (CV {cv})"
                  + (f" on GPU {result.gpu}" if result.gpu is not None else ""))
        dg = result.diagnosis
        if dg is not None:
            print(f"  verdict: {dg.verdict}. {dg.headline}")
            if dg.bound.get("text"):
                print(f"  bound: {dg.bound['text']}")
            for i, a in enumerate(dg.advice, 1):
                print(f"  advice {i}: {a.reason}")
        else:
            print(f"  {s.verdict_text}")
        if result.error:
            print(f"  error: {result.error}")
    if result.status == "failed":
        print(f"error: the workload failed: {(result.error or '').splitlines()[0]}",
              file=sys.stderr)
        return 1
    return 0


def _runner(args: argparse.Namespace, store: Store) -> Any:
    from monitor.collector import Collector
    from monitor.session import SessionManager
    from monitor.sweep import Runner

    if args.seconds_per_config <= 0:
        raise ConfigError("--seconds-per-config must be positive, e.g. 8")
    collector = Collector(store).start()
    manager = SessionManager(store, on_start=collector.watch)
    return Runner(store, collector, manager, args.seconds_per_config,
                  getattr(args, "windows", 3), args.memory_budget_mb)


def _close(runner: Any) -> None:
    runner.cancel.set()
    runner.manager.close()
    runner.collector.stop()


def _print_results(results: list) -> None:
    print(f"{'num_workers':>11} {'prefetch':>8} {'batch':>5} {'pin':>3} {'pers':>4}"
          f"{'samples/s':>11} {'spread':>7} {'wait':>6} {'busy':>6} {'peak MB':>8}  status")
    for r in results:
        c = r.config
        num = (f"{r.throughput:>11.1f} {r.throughput_spread or 0:>7.1%} "
               f"{r.data_wait_share or 0:>6.2f} {r.device_busy_mean or 0:>6.2f} "
               f"{r.peak_rss_mb or 0:>8.0f}") if r.throughput else f"{'':>43}"
        print(f"{c.num_workers:>11} {c.prefetch_factor or '-':>8} {c.batch_size:>5} "
              f"{'on' if c.pin_memory else 'off':>3} {'on' if c.persistent_workers else 'off':>4}"
              f"{num}  {r.status}{': ' + r.reason if r.reason else ''}")


def _sweep(args: argparse.Namespace, base: LoaderConfig, store: Store) -> int:
    from monitor.sweep import find_knee, grid, parse_param

    params: dict[str, list] = {}
    try:
        for text in args.param:
            name, values = parse_param(text)
            params[name] = values
        if not params:
            params["num_workers"] = list(range(0, max_workers() + 1))
        configs = grid(base, params)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runner = _runner(args, store)
    state = None
    try:
        print(f"sweeping {len(configs)} configurations, {args.seconds_per_config:g} s each",
              file=sys.stderr)
        state = runner.sweep(configs)
    finally:
        _close(runner)
    results = state.results
    knee = find_knee(results)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            rows = [r.to_dict() for r in results]
            flat = [{**row.pop("config"), **row} for row in rows]
            writer = csv.DictWriter(f, fieldnames=list(flat[0]) if flat else ["status"])
            writer.writeheader()
            writer.writerows(flat)
    out = {
        "results": [r.to_dict() for r in results],
        "best": _point(knee.best) if knee else None,
        "knee": {**_point(knee.knee), "text": knee.text} if knee else None,
        "seconds": state.seconds, "error": state.error,
    }
    if args.json:
        print(json.dumps(out))
    else:
        _print_results(results)
        print(f"knee: {knee.text}" if knee else "no configuration measured")
    return 1 if state.error else 0


def _point(r: Any) -> dict:
    return {"config": r.to_dict()["config"], "throughput": r.throughput, "run_id": r.run_id,
            "data_wait_share": r.data_wait_share, "peak_rss_mb": r.peak_rss_mb}


def _tune(args: argparse.Namespace, base: LoaderConfig, store: Store) -> int:
    runner = _runner(args, store)
    try:
        state = runner.tune(base, args.max_workers or max_workers(), args.budget_seconds)
    finally:
        _close(runner)
    best = state.best
    out = {"best": best["config"] if best else None,
           "throughput": best["throughput"] if best else None,
           "run_id": best["run_id"] if best else None,
           "configs_tried": len(state.results), "seconds": state.seconds,
           "tried": [r.to_dict() for r in state.results], "error": state.error}
    if args.json:
        print(json.dumps(out))
    else:
        _print_results(state.results)
        if best:
            c = best["config"]
            print(f"best: num_workers={c['num_workers']} prefetch_factor={c['prefetch_factor']}"
                  f" batch_size={c['batch_size']}: {best['throughput']:.1f} samples/s "
                  f"({len(state.results)} configurations, {state.seconds:.0f} s)")
    return 1 if state.error or not best else 0


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop workloads


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        from monitor.attached_run import run_attached

        return run_attached(args)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = Store(args.db)
    try:
        if args.command == "measure":
            return _measure(args, config, store)
        if args.command == "sweep":
            return _sweep(args, config, store)
        if args.command == "tune":
            return _tune(args, config, store)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: workloads stopped, finished runs kept in the store",
              file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
