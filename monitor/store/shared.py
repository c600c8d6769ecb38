"""Small shared state in the store: a distributed job's ranks, the GPU inventory the
collector sees, and key/value notes between processes (the collector process's follow
request). A mixin of Store: the same connection per thread."""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from monitor.records import GpuDevice

if TYPE_CHECKING:
    import pandas as pd


class SharedState:
    """Needs the Store's `_conn()` and `_frame()`."""

    # -- ranks of a distributed job ------------------------------------------------------
    def set_rank(self, run_id: int, rank: int, local_rank: int | None, world_size: int,
                 hostname: str, pid: int, config: dict[str, Any] | None = None,
                 accelerator_kind: str | None = None,
                 device: dict[str, Any] | None = None) -> None:
        """What one rank's probe says of itself (at its first epoch, and after changes);
        `device`: its CUDA device as the collector finds it in NVML (uuid, pci, index)."""
        self._conn().execute(
            "INSERT OR REPLACE INTO ranks (run_id, rank, local_rank, world_size, hostname, pid,"
            " config, accelerator_kind, device, ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, rank, local_rank, world_size, hostname, pid,
             json.dumps(config, sort_keys=True) if config is not None else None,
             accelerator_kind, json.dumps(device) if device else None, time.time()))

    def ranks(self, run_id: int) -> pd.DataFrame:
        """One row per rank that has reported, by rank; `config` parsed."""
        df = self._frame("SELECT * FROM ranks WHERE run_id = ? ORDER BY rank", (run_id,))
        if not df.empty:
            df["config"] = [json.loads(c) if isinstance(c, str) else {} for c in df["config"]]
            df["device"] = [json.loads(d) if isinstance(d, str) else None for d in df["device"]]
        return df

    def job_run(self, key: str, name: str, config: dict[str, Any]) -> int:
        """The one run of a distributed job, by a key its ranks share (launcher's run id and
        host): the first rank to ask creates it, the others get the same id."""
        conn = self._conn()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return int(row[0])
            cur = conn.execute(
                "INSERT INTO runs (name, kind, config, status, started_at) "
                "VALUES (?, 'attached', ?, 'running', ?)",
                (name, json.dumps(config, sort_keys=True), time.time()))
            run_id = int(cur.lastrowid)
            conn.execute("INSERT INTO meta (key, value, ts) VALUES (?, ?, ?)",
                         (key, str(run_id), time.time()))
            return run_id

    def control_after(self, run_id: int, after_id: int) -> list[tuple[int, str, Any]]:
        """Every control request of a run after `after_id`, applied or not (each rank of a
        job applies a job-wide request itself)."""
        rows = self._conn().execute(
            "SELECT id, kind, payload FROM control WHERE run_id = ? AND id > ? ORDER BY id",
            (run_id, after_id)).fetchall()
        return [(i, k, json.loads(p) if p else None) for i, k, p in rows]

    # -- small shared state (the collector process's follow request) ------------------------
    def set_meta(self, key: str, value: str | None) -> None:
        self._conn().execute("INSERT OR REPLACE INTO meta (key, value, ts) VALUES (?, ?, ?)",
                             (key, value, time.time()))

    def meta(self, key: str) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    # -- GPU inventory: collector -> page ---------------------------------------------------
    def set_gpu_inventory(self, available: bool, notice: str,
                          devices: Sequence[GpuDevice]) -> None:
        """What the collector's GPU backend sees, for readers in other threads and
        processes (the page reads this, never the collector object)."""
        conn = self._conn()
        with conn:
            conn.execute("BEGIN")
            conn.execute("DELETE FROM gpu_devices")
            conn.executemany(
                "INSERT INTO gpu_devices (idx, name, uuid, pci, mem_total_mb, gpm) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(d.index, d.name, d.uuid, json.dumps(list(d.pci)) if d.pci else None,
                  d.mem_total_mb, int(d.gpm)) for d in devices])
            conn.executemany("INSERT OR REPLACE INTO meta (key, value, ts) VALUES (?, ?, ?)",
                             [("gpu_available", "1" if available else "0", time.time()),
                              ("gpu_notice", notice, time.time())])

    def gpu_inventory(self) -> tuple[bool, str, list[GpuDevice]]:
        """(available, notice, devices) as the collector last wrote them."""
        conn = self._conn()
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'gpu_%'"))
        rows = conn.execute("SELECT idx, name, uuid, pci, mem_total_mb, gpm FROM gpu_devices "
                            "ORDER BY idx").fetchall()
        devices = [GpuDevice(i, n, u, tuple(json.loads(p)) if p else None, m, bool(g))
                   for i, n, u, p, m, g in rows]
        return (meta.get("gpu_available") == "1",
                meta.get("gpu_notice") or "no GPU telemetry yet", devices)


    # -- retention -------------------------------------------------------------------------
    def size_bytes(self) -> int:
        """The store's size on disk: the file and its write-ahead log."""
        return sum(p.stat().st_size for p in (self.path, self.path.with_name(
            self.path.name + "-wal")) if p.exists())

    def gc(self, keep_days: float | None = None,
           max_mb: float | None = None) -> tuple[list[int], int, int]:
        """Remove ended runs older than `keep_days`, then the oldest ended runs until the
        store is under `max_mb`; vacuum. Never a running run. Returns (runs removed, bytes
        before, bytes after)."""
        before = self.size_bytes()
        conn = self._conn()
        ended = conn.execute("SELECT id, COALESCE(ended_at, started_at) FROM runs "
                             "WHERE status != 'running' ORDER BY id").fetchall()
        removed: list[int] = []
        if keep_days is not None:
            cutoff = time.time() - keep_days * 86400
            removed += [r for r, t in ended if t < cutoff]
            self._delete(removed, cutoff)
        if max_mb is not None:
            for run_id, t in ended:
                if self.size_bytes() <= max_mb * 1e6:
                    break
                if run_id not in removed:
                    removed.append(run_id)
                    self._delete([run_id], t)
        return removed, before, self.size_bytes()

    def _delete(self, run_ids: list[int], older_than: float) -> None:
        conn = self._conn()
        marks = ", ".join("?" * len(run_ids))
        with conn:
            conn.execute("BEGIN")
            for table in ("steps", "step_seconds", "host_samples", "events", "control", "ranks",
                          "runs"):
                col = "id" if table == "runs" else "run_id"
                if run_ids:
                    conn.execute(f"DELETE FROM {table} WHERE {col} IN ({marks})", run_ids)
            for table in ("gpu_samples", "gpu_util"):  # machine-wide rows, by time
                conn.execute(f"DELETE FROM {table} WHERE ts < ?", (older_than,))
            conn.execute("DELETE FROM host_samples WHERE run_id IS NULL AND ts < ?",
                         (older_than,))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
