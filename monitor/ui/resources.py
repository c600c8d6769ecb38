"""The dashboard process's shared objects: one store, collector and session manager,
created once through st.cache_resource and shared by every browser session."""
from __future__ import annotations

import argparse
import atexit
import os
import sys
from dataclasses import dataclass

import streamlit as st

from monitor.collector import Collector
from monitor.config import DEFAULT_PRESET, ConfigError, LoaderConfig
from monitor.jobs import JobHolder
from monitor.session import SessionManager
from monitor.store import Store
from monitor.workload_spec import ENV_VAR, check
from workloads.presets import preset_batch_size


@dataclass(frozen=True, slots=True)
class Runtime:
    store: Store
    collector: Collector
    manager: SessionManager
    jobs: JobHolder
    workload: dict | None  # the checked --workload spec ({"ok": True, "spec": ...}) or None
    workload_error: str | None


def workload_arg(argv: list[str] | None = None) -> str | None:
    """`streamlit run app.py -- --workload SPEC` (make run WORKLOAD=SPEC), or
    $STARVATION_MONITOR_WORKLOAD. Named at launch only: the page never loads code it is
    told about in the browser."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--workload", default=None)
    args, _ = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    return args.workload or os.environ.get(ENV_VAR) or None


def default_config(workload: dict | None = None) -> LoaderConfig:
    if workload and workload.get("ok"):
        d = workload.get("defaults") or {}
        keep = {k: d[k] for k in ("num_workers", "batch_size", "prefetch_factor", "pin_memory",
                                  "persistent_workers") if k in d}
        try:
            return LoaderConfig.build(workload=workload["spec"], **{"batch_size": 32, **keep})
        except ConfigError:
            return LoaderConfig.build(workload=workload["spec"])
    return LoaderConfig.build(preset=DEFAULT_PRESET, num_workers=0,
                              batch_size=preset_batch_size(DEFAULT_PRESET))


@st.cache_resource
def get_runtime() -> Runtime:
    """Store at $STARVATION_MONITOR_DB or runs/monitor.db; the collector and manager own
    their threads and stop at interpreter exit (the workload with them)."""
    store = Store()
    spec = workload_arg()
    info, error = None, None
    if spec:
        info = check(spec)
        if not info.get("ok"):
            info, error = None, f"workload {spec}: {info.get('error')}"
    collector = Collector(store).start()
    manager = SessionManager(store, default_config(info), on_start=collector.watch)
    jobs = JobHolder(store, collector, manager)
    atexit.register(collector.stop)
    atexit.register(jobs.stop)  # runs first (LIFO): a sweep ends before the manager closes
    return Runtime(store, collector, manager, jobs, info, error)
