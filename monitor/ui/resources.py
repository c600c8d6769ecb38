"""The dashboard process's shared objects: one store, collector and session manager,
created once through st.cache_resource and shared by every browser session."""
from __future__ import annotations

import atexit
from dataclasses import dataclass

import streamlit as st

from monitor.collector import Collector
from monitor.config import DEFAULT_PRESET, LoaderConfig
from monitor.jobs import JobHolder
from monitor.session import SessionManager
from monitor.store import Store
from workloads.presets import preset_batch_size


@dataclass(frozen=True, slots=True)
class Runtime:
    store: Store
    collector: Collector
    manager: SessionManager
    jobs: JobHolder


def default_config() -> LoaderConfig:
    return LoaderConfig.build(preset=DEFAULT_PRESET, num_workers=0,
                              batch_size=preset_batch_size(DEFAULT_PRESET))


@st.cache_resource
def get_runtime() -> Runtime:
    """Store at $STARVATION_MONITOR_DB or runs/monitor.db; the collector and manager own
    their threads and stop at interpreter exit (the workload with them)."""
    store = Store()
    collector = Collector(store).start()
    manager = SessionManager(store, default_config(), on_start=collector.watch)
    jobs = JobHolder(store, collector, manager)
    atexit.register(collector.stop)
    atexit.register(jobs.stop)  # runs first (LIFO): a sweep ends before the manager closes
    return Runtime(store, collector, manager, jobs)
