"""What the store keeps: removing ended runs by age or by size (never a running run), and
the file's integrity check."""
from __future__ import annotations

import time

from monitor.store.db import Db

# Tables whose rows belong to one run (by run_id; `runs` by id), and machine-wide tables
# (by time).
RUN_TABLES = ("steps", "step_seconds", "host_samples", "events", "control", "ranks", "runs")
MACHINE_TABLES = ("gpu_samples", "gpu_util")


class Retention:
    """Deletes across every table, in one transaction per removal."""
    db: Db  # the Store's file (core.py: the Store is made of these parts)

    def gc(self, keep_days: float | None = None,
           max_mb: float | None = None) -> tuple[list[int], int, int]:
        """Remove ended runs older than `keep_days`, then the oldest ended runs until the
        store is under `max_mb`; vacuum. Never a running run. Returns (runs removed, bytes
        before, bytes after)."""
        before = self.db.size_bytes()
        ended = self.db.conn().execute(
            "SELECT id, COALESCE(ended_at, started_at) FROM runs "
            "WHERE status != 'running' ORDER BY id").fetchall()
        removed: list[int] = []
        if keep_days is not None:
            cutoff = time.time() - keep_days * 86400
            removed += [r for r, t in ended if t < cutoff]
            self._delete(removed, cutoff)
        if max_mb is not None:
            for run_id, t in ended:
                if self.db.size_bytes() <= max_mb * 1e6:
                    break
                if run_id not in removed:
                    removed.append(run_id)
                    self._delete([run_id], t)
        return removed, before, self.db.size_bytes()

    def _delete(self, run_ids: list[int], older_than: float) -> None:
        conn = self.db.conn()
        marks = ", ".join("?" * len(run_ids))
        with conn:
            conn.execute("BEGIN")
            for table in RUN_TABLES:
                col = "id" if table == "runs" else "run_id"
                if run_ids:
                    conn.execute(f"DELETE FROM {table} WHERE {col} IN ({marks})", run_ids)
            for table in MACHINE_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE ts < ?", (older_than,))
            conn.execute("DELETE FROM host_samples WHERE run_id IS NULL AND ts < ?",
                         (older_than,))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")

    def integrity_ok(self) -> bool:
        return self.db.conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
