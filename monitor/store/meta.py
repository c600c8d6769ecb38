"""Small shared state between processes: `meta` (key/value notes such as the collector
process's follow request), `calibration` (a preset's calibrated step, reused for a while) and
`gpu_devices` (the GPU inventory the collector sees, read by the page)."""
from __future__ import annotations

import json
import time
from collections.abc import Sequence

from monitor.records import GpuDevice
from monitor.store.db import Db

# A calibrated preset step is reused for this long, so runs compared one after another (the
# CLI, a sweep, the page's restarts) meet the same simulated device.
CALIBRATION_MAX_AGE_S = 6 * 3600


class Meta:
    """Owns `meta`, `calibration` and `gpu_devices`."""
    db: Db  # the Store's file (core.py: the Store is made of these parts)

    def set_meta(self, key: str, value: str | None) -> None:
        self.db.conn().execute("INSERT OR REPLACE INTO meta (key, value, ts) VALUES (?, ?, ?)",
                               (key, value, time.time()))

    def meta(self, key: str) -> str | None:
        row = self.db.conn().execute("SELECT value FROM meta WHERE key = ?",
                                     (key,)).fetchone()
        return row[0] if row else None

    def calibration(self, key: str, max_age_s: float = CALIBRATION_MAX_AGE_S) -> float | None:
        """A calibrated value younger than `max_age_s`, else None."""
        row = self.db.conn().execute("SELECT value, ts FROM calibration WHERE key = ?",
                                     (key,)).fetchone()
        return float(row[0]) if row and time.time() - row[1] <= max_age_s else None

    def calibration_with_age(self, key: str, max_age_s: float = CALIBRATION_MAX_AGE_S,
                             ) -> tuple[float | None, float | None]:
        """(value, seconds since it was measured), or (None, None)."""
        row = self.db.conn().execute("SELECT value, ts FROM calibration WHERE key = ?",
                                     (key,)).fetchone()
        age = time.time() - row[1] if row else None
        return (float(row[0]), age) if row and age <= max_age_s else (None, None)

    def set_calibration(self, key: str, value: float) -> None:
        self.db.conn().execute("INSERT OR REPLACE INTO calibration (key, value, ts) "
                               "VALUES (?, ?, ?)", (key, value, time.time()))

    def set_gpu_inventory(self, available: bool, notice: str,
                          devices: Sequence[GpuDevice]) -> None:
        """What the collector's GPU backend sees, for readers in other threads and
        processes (the page reads this, never the collector object)."""
        conn = self.db.conn()
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
        conn = self.db.conn()
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'gpu_%'"))
        rows = conn.execute("SELECT idx, name, uuid, pci, mem_total_mb, gpm FROM gpu_devices "
                            "ORDER BY idx").fetchall()
        devices = [GpuDevice(i, n, u, tuple(json.loads(p)) if p else None, m, bool(g))
                   for i, n, u, p, m, g in rows]
        return (meta.get("gpu_available") == "1",
                meta.get("gpu_notice") or "no GPU telemetry yet", devices)
