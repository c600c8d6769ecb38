"""Command line: python -m monitor {measure, sweep, tune, run} ...

Parses and prints only: the work is monitor/manage/measure.py, monitor/tuning/ and
monitor/manage/attached_run.py, put together by monitor/manage/runtime.py. Every argument is
validated before the store is opened, so a refused command creates nothing.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from monitor.cli.args import build_parser, parse_param
from monitor.config import SETTING, SETTINGS, ConfigError, LoaderConfig, max_workers, normalise
from monitor.sampling.budget import usable_cores
from monitor.store import ENV_VAR, FAILED


def _config(args: argparse.Namespace, limit: int) -> LoaderConfig:
    """The settings from the flags; a user workload's own defaults fill what is not given."""
    from monitor.presets import preset_batch_size

    defaults: dict = {}
    if args.workload:
        from monitor.manage.workload_spec import check

        info = check(args.workload)
        if not info.get("ok"):
            raise ConfigError(f"workload {args.workload}: {info.get('error')}")
        defaults = info.get("defaults") or {}
        print(f"workload {args.workload}: {info.get('kind')} {info.get('dataset')}"
              + (f", {info['length']} samples" if info.get("length") else ""), file=sys.stderr)

    def pick(name: str, fallback: object) -> object:
        flag = getattr(args, name)  # None: not given (a switch's --no- form gives False)
        return flag if flag is not None else defaults.get(name, fallback)

    fallback = {"batch_size": preset_batch_size(args.preset) if not args.workload else 32,
                "prefetch_factor": None}  # unset: torch's default, filled below
    kwargs = {s.name: pick(s.name, fallback.get(s.name, s.default)) for s in SETTINGS}
    kwargs.update(
        step_time_ms=args.step_time_ms, model_size=args.model_size,
        epoch_samples=args.epoch_samples,
    )
    if args.workload:
        return LoaderConfig.build(worker_limit=limit, workload=args.workload, **kwargs)
    kwargs = normalise(kwargs, clear=False)  # torch's default prefetch, said
    # the constructor, not build(): flags that do not apply are refused, not dropped, and a
    # calibrated preset's step stays None (the workload measures it)
    cfg = LoaderConfig(preset=args.preset, **kwargs)
    cfg.check_workers(limit)
    return cfg


POSITIVE = (("seconds", "--seconds must be positive, e.g. --seconds 10"),
            ("seconds_per_config", "--seconds-per-config must be positive, e.g. 8"),
            ("windows", "--windows must be positive, e.g. 3"))


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse bad durations before anything is created."""
    for name, message in POSITIVE:
        v = getattr(args, name, None)
        if v is not None and v <= 0:
            raise ConfigError(message)


def _print_measurement(result: Any) -> None:
    s = result.summary
    print(f"run {result.run_id} ({result.status}) on {result.accelerator}")
    print(f"  throughput        {s.throughput:.1f} samples/s over {s.steps} steps "
          f"({s.window_s:.1f} s steady state)")
    print(f"  data-wait share   {s.data_wait_share:.1%}")
    print(f"  device busy mean  {s.device_busy_mean:.1%} (CV {s.device_busy_cv:.2f})")
    if result.gpu_util_mean is not None:
        cv = f"{result.gpu_util_cv:.2f}" if result.gpu_util_cv is not None else "–"
        print(f"  GPU util (NVML)   {result.gpu_util_mean:.1f}% (CV {cv})"
              + (f" on GPU {result.gpu}" if result.gpu is not None else ""))
    a = result.assessment
    if a is not None:
        dg = a.diagnosis
        print(f"  verdict: {dg.named}. {dg.headline}")  # the cause, as --json says
        if dg.bound.get("text"):
            print(f"  bound: {dg.bound['text']}")
        for i, adv in enumerate(dg.advice, 1):
            print(f"  advice {i}: {adv.reason}")
    if result.error:
        print(f"  error: {result.error}")


def _measure(args: argparse.Namespace, config: LoaderConfig, rt: Any) -> int:
    from monitor.manage.measure import failure_line, measure

    result = measure(rt, config, args.seconds)
    rt.store.check()  # a store deleted under the run: say so rather than print lost figures
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        _print_measurement(result)
    if result.status == FAILED:
        print(f"error: run {result.run_id} failed: {failure_line(result.error)}",
              file=sys.stderr)
        return 1
    return 0


def _print_results(results: list) -> None:
    """The sweep's table: a column per declared loader setting, then the figures."""
    cols = [(s.name, max(len(s.short), 3)) for s in SETTINGS]
    print(" ".join(f"{s.short:>{w}}" for s, (_, w) in zip(SETTINGS, cols, strict=True))
          + f"{'samples/s':>11} {'spread':>7} {'wait':>6} {'busy':>6} {'peak MB':>8}  status")
    for r in results:
        c = r.config
        num = (f"{r.throughput:>11.1f} {r.throughput_spread or 0:>7.1%} "
               f"{r.data_wait_share or 0:>6.2f} {r.device_busy_mean or 0:>6.2f} "
               f"{r.peak_memory_mb or 0:>8.0f}") if r.throughput else f"{'':>43}"
        cells = [f"{SETTING[name].shown(getattr(c, name)):>{w}}" for name, w in cols]
        print(" ".join(cells) + f"{num}  {r.status}{': ' + r.reason if r.reason else ''}")


def _point(r: Any) -> dict:
    return {"config": r.to_dict()["config"], "throughput": r.throughput, "run_id": r.run_id,
            "data_wait_share": r.data_wait_share, "peak_memory_mb": r.peak_memory_mb}


def _sweep_configs(args: argparse.Namespace, base: LoaderConfig, limit: int) -> list:
    from monitor.tuning.search import grid

    params: dict[str, list] = {}
    for text in args.param:
        name, values = parse_param(text)
        params[name] = values
    if not params:
        params["num_workers"] = list(range(0, limit + 1))
    return grid(base, params)


def _write_csv(path: str, results: list) -> None:
    with open(path, "w", newline="") as f:
        flat = []
        for r in results:
            row = r.to_dict()
            cfg = row.pop("config")
            flat.append({**cfg, **{k: v for k, v in row.items()
                                   if not isinstance(v, (dict, list))}})
        writer = csv.DictWriter(f, fieldnames=list(flat[0]) if flat else ["status"])
        writer.writeheader()
        writer.writerows(flat)


def _sweep(args: argparse.Namespace, configs: list, rt: Any) -> int:
    from monitor.manage.experiment import Experiments
    from monitor.tuning.search import find_knee

    exp = Experiments(rt, args.seconds_per_config, args.windows)
    print(f"sweeping {len(configs)} configurations, {args.seconds_per_config:g} s each",
          file=sys.stderr)
    state = exp.sweep(configs)
    results = state.results
    knee = find_knee(results)
    if args.csv:
        _write_csv(args.csv, results)
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


def _tune(args: argparse.Namespace, base: LoaderConfig, rt: Any) -> int:
    from monitor.manage.experiment import Experiments

    exp = Experiments(rt, args.seconds_per_config)
    state = exp.tune(base, args.max_workers or rt.max_workers, args.budget_seconds)
    best = state.best
    out = {"best": best["config"] if best else None,
           "throughput": best["throughput"] if best else None,
           "run_id": best["run_id"] if best else None,
           "configs_tried": len(state.results), "seconds": state.seconds,
           "settled": best.get("settled") if best else None,
           "moves": best.get("moves") if best else None,
           "extensions": best.get("extensions") if best else None,
           "rematches": best.get("rematches") if best else None,
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
            if best.get("settled"):
                print(f"tune {best['settled']}")
    return 1 if state.error or not best else 0


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # NOTE [shutdown protocol] in monitor/manage/runtime.py, 7


def _prepare(args: argparse.Namespace) -> tuple[LoaderConfig, list | None]:
    """Everything that can be refused, before anything is created."""
    limit = max_workers(usable_cores())
    _check_numbers(args)
    config = _config(args, limit)
    configs = _sweep_configs(args, config, limit) if args.command == "sweep" else None
    return config, configs


def _export_folder(folder: Path) -> Path:
    """The run export to import: the folder itself, or the one run folder inside the folder
    given to `export --out`; ExportError (listing them) for none or several."""
    from monitor.export.files import ExportError

    if Path(folder, "run.json").is_file():
        return folder
    runs = sorted(p for p in folder.glob("run-*") if Path(p, "run.json").is_file()) \
        if folder.is_dir() else []
    if len(runs) == 1:
        return runs[0]
    if runs:
        raise ExportError(f"{folder} holds {len(runs)} run exports: import one of them, e.g. "
                          + ", ".join(str(p) for p in runs))
    raise ExportError(f"{folder} is not a run export (no run.json): give the folder that "
                      "python -m monitor export wrote")


def _files(args: argparse.Namespace) -> int:
    """export / import / report: exit 2 with one line for anything refused."""
    from monitor.export.files import ExportError, export_run, import_run
    from monitor.manage.context import machine_context
    from monitor.store import Store, StoreError, default_path

    def default_db(db: str | None) -> Path:
        return Path(db) if db else default_path()

    try:
        if args.command == "import":
            args.folder = str(_export_folder(Path(args.folder)))
        if args.command in ("export", "report"):
            if not default_db(args.db).exists():
                raise ExportError(f"there is no store at {default_db(args.db)}: pass --db with "
                                  "the store the run was recorded in")
            store = Store(args.db)
            run_id = store.resolve_run(args.run)
            if run_id is None:
                raise ExportError(f"no run {args.run!r} in the store {store.path}: give a run "
                                  "id, latest, latest~1 or name:NAME")
            if args.command == "report":
                from monitor.ui.report import write

                out = Path(args.html or f"run-{run_id}.html")
                print(write(store, run_id, machine_context(), out))
            else:
                print(export_run(store, run_id, Path(args.out), args.format,
                                 machine_context()))
        else:
            store = Store(args.db)
            new = import_run(store, Path(args.folder))
            print(f"imported as run {new} into {store.path}")
    except (ExportError, StoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    """`streamlit run` on the page inside the package, bound to --address (127.0.0.1), with
    Streamlit's settings on its command line (spawn.STREAMLIT_SETTINGS: nothing sent out,
    whatever folder it is started from): this
    process becomes it (exec), so a SIGTERM or Ctrl-C reaches the server itself and closing
    it leaves no server behind (a child would outlive a killed parent)."""
    from monitor.manage import spawn

    if args.prometheus and not args.prometheus.startswith(("http://", "https://")):
        print(f"error: --prometheus {args.prometheus!r} is not a URL: give Prometheus's base "
              "URL, e.g. http://127.0.0.1:9090", file=sys.stderr)
        return 2
    env = spawn.child_env()
    if args.db:
        env[ENV_VAR] = str(Path(args.db).resolve())
    if args.watch:
        env["STARVATION_MONITOR_AUTOSTART"] = "0"
    extra = (["--workload", args.workload] if args.workload else []) + (
        ["--metrics-port", str(args.metrics_port)] if args.metrics_port else []) + (
        ["--prometheus", args.prometheus] if args.prometheus else [])
    page = spawn.PACKAGE / "ui" / "_serve" / "dashboard.py"
    cmd = spawn.streamlit_command(page, args.address, args.port, extra)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 0  # not reached: execve replaces this process


def main(argv: list[str] | None = None) -> int:
    args = build_parser(max_workers(usable_cores())).parse_args(argv)
    if args.command == "dashboard":
        return _dashboard(args)
    if args.command == "doctor":
        from monitor.cli.doctor import doctor_command

        return doctor_command(args)
    if args.command == "run":
        from monitor.manage.attached_run import run_attached

        return run_attached(args)
    if args.command in ("export", "import", "report"):
        return _files(args)
    if args.command in ("compare", "gc"):
        from monitor.cli.compare import compare_command, gc_command

        return compare_command(args) if args.command == "compare" else gc_command(args)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        config, configs = _prepare(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from monitor.manage.runtime import Runtime
    from monitor.store import StoreError

    try:
        rt = Runtime(args.db, memory_budget_mb=args.memory_budget_mb).start()
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "measure":
            return _measure(args, config, rt)
        if args.command == "sweep":
            return _sweep(args, configs or [], rt)
        return _tune(args, config, rt)
    except KeyboardInterrupt:
        print("interrupted: workloads stopped, finished runs kept in the store",
              file=sys.stderr)
        return 130
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        rt.close()  # NOTE [shutdown protocol] in monitor/manage/runtime.py, 6


def console() -> None:
    """The `starvation-monitor` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console()
