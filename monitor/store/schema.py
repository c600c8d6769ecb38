"""The store's SQL schema: every table but the record tables (steps, host_samples,
gpu_samples, gpu_util, which come from monitor/records.py). `step_seconds` is the rollup
(rollups.py)."""
from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    config TEXT NOT NULL,
    accelerator TEXT,
    accelerator_kind TEXT,
    device TEXT,
    status TEXT NOT NULL,
    error TEXT,
    pid INTEGER,
    started_at REAL NOT NULL,
    ended_at REAL,
    identity TEXT
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    data TEXT
);
CREATE TABLE IF NOT EXISTS control (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT,
    applied_at REAL,
    result TEXT
);
CREATE TABLE IF NOT EXISTS gpu_devices (
    idx INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    uuid TEXT,
    pci TEXT,
    mem_total_mb REAL,
    gpm INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ranks (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    local_rank INTEGER,
    world_size INTEGER,
    hostname TEXT,
    pid INTEGER,
    config TEXT,
    accelerator_kind TEXT,
    device TEXT,
    job_id TEXT,
    node_rank INTEGER,
    nodes INTEGER,
    placement TEXT,
    ts REAL NOT NULL,
    PRIMARY KEY (run_id, rank)
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT,
    ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS calibration (
    key TEXT PRIMARY KEY,
    value REAL NOT NULL,
    ts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS step_seconds (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    sec INTEGER NOT NULL,
    steps INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    wait_s REAL NOT NULL,
    compute_s REAL NOT NULL,
    max_wait_s REAL NOT NULL,
    max_compute_s REAL NOT NULL,
    PRIMARY KEY (run_id, rank, sec)
);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, ts);
CREATE INDEX IF NOT EXISTS control_run ON control(run_id, id);
"""
