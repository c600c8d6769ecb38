"""The outputs `monitor run` can give a live run, each an Output of its follow
(monitor/assess/follow.py), each one entry of KINDS with its flags: the CLI adds every kind's
flags to `run`, and `run_attached` makes the ones asked for before the run exists (a port
that cannot be had creates nothing) and hands them to Runtime.follow. A new output is its
own file and one entry here. Nothing heavy is imported until an output is made (`monitor
--help` and the start of every run stay fast)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from monitor.assess.follow import Output


class Kind(Protocol):
    """One kind of output: its flags, and the output the parsed flags ask for (None: not
    asked). `make` raises OutputError, saying what to do, when it cannot be had."""

    def add_flags(self, p: argparse.ArgumentParser) -> None: ...

    def make(self, args: argparse.Namespace, rt: Any) -> Output | None: ...


class OutputError(RuntimeError):
    """An output asked for that cannot be had; the message says what to do."""


class Metrics:
    """Prometheus's /metrics while the run lasts (monitor/export/prometheus.py)."""

    def add_flags(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                       help="serve Prometheus metrics on http://ADDRESS:PORT/metrics while "
                            "it runs")
        p.add_argument("--metrics-address", default="127.0.0.1", metavar="ADDRESS",
                       help="address for --metrics-port (default 127.0.0.1: this machine "
                            "only; 0.0.0.0 lets a cluster's Prometheus scrape it)")

    def make(self, args: argparse.Namespace, rt: Any) -> Output | None:
        if getattr(args, "metrics_port", None) is None:
            return None
        from monitor.export.prometheus import ExporterError, MetricsOutput

        try:
            out = MetricsOutput(str(rt.store.path), rt.context(), args.metrics_port,
                                args.metrics_address)
        except ExporterError as exc:
            raise OutputError(str(exc)) from None
        print(f"starvation-monitor: metrics on http://{args.metrics_address}:"
              f"{args.metrics_port}/metrics", file=sys.stderr)
        return out


class Terminal:
    """The live view on stderr (monitor/manage/terminal.py)."""

    def add_flags(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                       help="show throughput, data-wait share, verdict, the top advice and "
                            "workers every 2 s on stderr (default: on when stderr is a "
                            "terminal, as a live table with the script's output above it; "
                            "otherwise one plain line each time)")

    def make(self, args: argparse.Namespace, rt: Any) -> Output | None:
        flag = getattr(args, "live", None)  # --live / --no-live, else on at a terminal
        if not (flag if flag is not None else sys.stderr.isatty()):
            return None
        from monitor.manage import terminal

        return terminal.LiveView(tty=sys.stderr.isatty())


class TensorBoard:
    """Event files under DIR, read by TensorBoard (monitor/export/tensorboard.py)."""

    def add_flags(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--tensorboard", metavar="DIR", default=None,
                       help="write the run's per-step figures (data-wait share, samples/s, "
                            "wait and compute per step, phases, workers) and its verdict as "
                            "TensorBoard event files under DIR/run-N (needs the "
                            "[tensorboard] extra)")

    def make(self, args: argparse.Namespace, rt: Any) -> Output | None:
        if not getattr(args, "tensorboard", None):
            return None
        from monitor.export.tensorboard import TensorBoardMissing, TensorBoardOutput

        try:
            return TensorBoardOutput(args.tensorboard, rt.store)
        except (TensorBoardMissing, OSError) as exc:
            raise OutputError(str(exc)) from None


class Mlflow:
    """Metrics of an MLflow run on a tracking server (monitor/export/mlflow_rest.py)."""

    def add_flags(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--mlflow", metavar="URI", nargs="?", const="", default=None,
                       help="log the run's per-step figures as metrics (starvation/...) and "
                            "its verdict as tags to an MLflow tracking server: the script's "
                            "own run where it has one, else a run of its own (URI default: "
                            "$MLFLOW_TRACKING_URI)")

    def make(self, args: argparse.Namespace, rt: Any) -> Output | None:
        if getattr(args, "mlflow", None) is None:
            return None
        from monitor.export.mlflow_rest import MlflowError, MlflowOutput

        try:
            return MlflowOutput(args.mlflow or None, rt.store, script_name(args.cmd))
        except MlflowError as exc:
            raise OutputError(str(exc)) from None


class Wandb:
    """A Weights & Biases run's metrics (monitor/export/wandb_out.py)."""

    def add_flags(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--wandb", metavar="PROJECT", nargs="?", const="", default=None,
                       help="log the run's per-step figures (starvation/...) and its verdict "
                            "to Weights & Biases: the script's own run where $WANDB_RUN_ID "
                            "names it (online), else a run of its own in PROJECT (default "
                            "$WANDB_PROJECT, else starvation-monitor); WANDB_MODE=offline "
                            "works (needs the [wandb] extra)")

    def make(self, args: argparse.Namespace, rt: Any) -> Output | None:
        if getattr(args, "wandb", None) is None:
            return None
        from monitor.export.wandb_out import WandbMissing, WandbOutput

        try:
            return WandbOutput(args.wandb or None, rt.store, script_name(args.cmd))
        except WandbMissing as exc:
            raise OutputError(str(exc)) from None


def script_name(cmd: list[str]) -> str:
    """The training script's file name in a command line (`python train.py ...`, a
    launcher's `torchrun ... train.py`), else the command's."""
    cmd = [c for c in cmd if c != "--"]
    return next((os.path.basename(c) for c in cmd[1:] if c.endswith(".py")),
                os.path.basename(cmd[0]) if cmd else "script")


KINDS: tuple[Kind, ...] = (Metrics(), Terminal(), TensorBoard(), Mlflow(), Wandb())


def add_flags(p: argparse.ArgumentParser) -> None:
    for kind in KINDS:
        kind.add_flags(p)


def make(args: argparse.Namespace, rt: Any) -> list[Output]:
    """The outputs the flags ask for, in KINDS' order; OutputError for the first that cannot
    be had (those made before it are closed)."""
    made: list[Output] = []
    try:
        for kind in KINDS:
            out = kind.make(args, rt)
            if out is not None:
                made.append(out)
    except OutputError:
        for out in made:
            out.close()
        raise
    return made
