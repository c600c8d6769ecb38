"""The dashboard process's Runtime (monitor/manage/runtime.py), created once through
st.cache_resource and shared by every browser session."""
from __future__ import annotations

import argparse
import os
import sys

import streamlit as st

from monitor.config import DEFAULT_PRESET, LIVE_SETTINGS, ConfigError, LoaderConfig
from monitor.export.prometheus import ExporterError
from monitor.manage.runtime import Runtime
from monitor.manage.workload_spec import ENV_VAR, check
from monitor.presets import preset_batch_size

COLLECTOR_ENV = "STARVATION_MONITOR_COLLECTOR"  # "process" (default) or "thread"
METRICS_ENV = "STARVATION_MONITOR_METRICS_PORT"
PROMETHEUS_ENV = "STARVATION_MONITOR_PROMETHEUS"  # the Job tab's Prometheus (base URL)


def launch_args(argv: list[str] | None = None) -> argparse.Namespace:
    """`streamlit run app.py -- --workload SPEC --metrics-port PORT` (make run WORKLOAD=...
    METRICS_PORT=...), or $STARVATION_MONITOR_WORKLOAD / $STARVATION_MONITOR_METRICS_PORT.
    Named at launch only: the page never loads code it is told about in the browser."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--workload", default=os.environ.get(ENV_VAR) or None)
    p.add_argument("--metrics-port", type=int, default=os.environ.get(METRICS_ENV) or None)
    p.add_argument("--metrics-address", default="127.0.0.1")
    p.add_argument("--prometheus", default=os.environ.get(PROMETHEUS_ENV) or None)
    args, _ = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    return args


def workload_arg(argv: list[str] | None = None) -> str | None:
    return launch_args(argv).workload


def prometheus_arg(argv: list[str] | None = None) -> str | None:
    """The Prometheus whose series the Job tab reads, named at launch (`--prometheus`)."""
    return launch_args(argv).prometheus


def default_config(workload: dict | None = None) -> LoaderConfig:
    if workload and workload.get("ok"):
        d = workload.get("defaults") or {}
        keep = {k: d[k] for k in (*LIVE_SETTINGS, "batch_size") if k in d}
        try:
            return LoaderConfig.build(workload=workload["spec"], **{"batch_size": 32, **keep})
        except ConfigError:
            return LoaderConfig.build(workload=workload["spec"])
    return LoaderConfig.build(preset=DEFAULT_PRESET, num_workers=0,
                              batch_size=preset_batch_size(DEFAULT_PRESET))


@st.cache_resource
def get_runtime() -> Runtime:
    """Store at $STARVATION_MONITOR_DB or runs/monitor.db; the Runtime closes at interpreter
    exit (NOTE [shutdown protocol] in monitor/manage/runtime.py, 6)."""
    spec = workload_arg()
    info, error = None, None
    if spec:
        info = check(spec)
        if not info.get("ok"):
            info, error = None, f"workload {spec}: {info.get('error')}"
    # sampling in a process of its own unless a test injects a fake GPU into a thread
    own = os.environ.get(COLLECTOR_ENV, "process") == "process"
    rt = Runtime(config=default_config(info), collector_process=own)
    rt.workload, rt.workload_error = info, error
    args = launch_args()
    if args.metrics_port is not None:
        try:
            rt.serve_metrics(int(args.metrics_port), args.metrics_address)
        except ExporterError as exc:
            rt.metrics_error = str(exc)
    return rt.start()
