"""Command line: python -m monitor {measure} ...

measure: run a managed workload without the UI, record it to the store, print a summary.
"""
from __future__ import annotations

import argparse
import json
import sys

from monitor.config import MODEL_SIZES, PRESETS, ConfigError, LoaderConfig, max_workers
from monitor.diagnosis import BUDGET_ENV
from monitor.store import ENV_VAR, Store, default_path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m monitor",
        description="Starvation Monitor: is the GPU starved by its input pipeline?",
    )
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser(
        "measure",
        help="run a managed workload for a while and print throughput and data-wait share",
        description=(
            "Run a synthetic workload with the given DataLoader settings, record it to the "
            "store as a run, and summarise its steady state (the first fifth of the run, at "
            "most 2 s, is discarded as warm-up). Without CUDA the accelerator is simulated."
        ),
    )
    m.add_argument("--preset", choices=PRESETS, default="starving",
                   help="synthetic workload (default: starving)")
    m.add_argument("--num-workers", type=int, default=0,
                   help=f"DataLoader worker processes; 0 loads in the main process "
                        f"(this machine: up to {max_workers()} on the slider)")
    m.add_argument("--batch-size", type=int, default=None,
                   help="samples per batch (default: the preset's)")
    m.add_argument("--prefetch-factor", type=int, default=None,
                   help="batches loaded ahead per worker (needs --num-workers >= 1; default 2)")
    m.add_argument("--pin-memory", action="store_true",
                   help="copy batches into page-locked memory (faster host-to-GPU copies)")
    m.add_argument("--persistent-workers", action="store_true",
                   help="keep workers alive between epochs (needs --num-workers >= 1)")
    m.add_argument("--step-time-ms", type=float, default=None,
                   help="device time per step: the simulated accelerator's, or the CUDA "
                        "model's target with --model-size auto (default: the preset's)")
    m.add_argument("--model-size", choices=MODEL_SIZES, default="auto",
                   help="CUDA model: auto (default) repeats a width-64 net's pass to take about "
                        "the step time; small/medium/large are fixed widths, one pass per step "
                        "(ignored by the simulated accelerator)")
    m.add_argument("--epoch-samples", type=int, default=None,
                   help="samples per epoch (default: the preset's); short epochs show the "
                        "cost of restarting workers at every epoch")
    m.add_argument("--memory-budget-mb", type=float, default=None,
                   help="judge memory pressure against this budget instead of the machine's "
                        f"memory (also ${BUDGET_ENV})")
    m.add_argument("--seconds", type=float, default=10.0,
                   help="how long to measure after the first batch (default 10)")
    m.add_argument("--db", default=None,
                   help=f"SQLite store (default: ${ENV_VAR} or {default_path()})")
    m.add_argument("--json", action="store_true",
                   help="print one JSON object as the last line of stdout")
    return p


def _measure(args: argparse.Namespace) -> int:
    from monitor.measure import measure
    from workloads.presets import preset_batch_size

    if args.seconds <= 0:
        print("error: --seconds must be positive, e.g. --seconds 10", file=sys.stderr)
        return 2
    try:
        config = LoaderConfig(
            preset=args.preset, num_workers=args.num_workers,
            batch_size=args.batch_size if args.batch_size is not None
            else preset_batch_size(args.preset),
            prefetch_factor=args.prefetch_factor, pin_memory=args.pin_memory,
            persistent_workers=args.persistent_workers, step_time_ms=args.step_time_ms,
            model_size=args.model_size, epoch_samples=args.epoch_samples,
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = Store(args.db)
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "measure":
        return _measure(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
