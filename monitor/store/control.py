"""The `control` table: requests from the page, the CLI or the live tuner to a running
loader, and their results (the payloads and results are monitor/control.py's)."""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from monitor.store.db import Db

if TYPE_CHECKING:
    import pandas as pd


class Control:
    """Owns `control`."""
    db: Db  # the Store's file (core.py: the Store is made of these parts)

    def request_control(self, run_id: int, kind: str, payload: dict[str, Any] | None = None) -> int:
        """Queue a request for a run; returns its id."""
        cur = self.db.conn().execute(
            "INSERT INTO control (run_id, ts, kind, payload) VALUES (?, ?, ?, ?)",
            (run_id, time.time(), kind, json.dumps(payload) if payload is not None else None),
        )
        return int(cur.lastrowid)

    def pending_control(self, run_id: int, after_id: int = 0) -> list[tuple[int, str, Any]]:
        """Control requests for a run newer than `after_id` not yet applied, oldest first."""
        return self._after(run_id, after_id, " AND applied_at IS NULL")

    def control_after(self, run_id: int, after_id: int) -> list[tuple[int, str, Any]]:
        """Every control request of a run after `after_id`, applied or not (each rank of a
        job applies a job-wide request itself)."""
        return self._after(run_id, after_id, "")

    def _after(self, run_id: int, after_id: int, where: str) -> list[tuple[int, str, Any]]:
        rows = self.db.conn().execute(
            f"SELECT id, kind, payload FROM control WHERE run_id = ? AND id > ?{where} "
            "ORDER BY id", (run_id, after_id)).fetchall()
        return [(i, k, json.loads(p) if p else None) for i, k, p in rows]

    def mark_control(self, control_id: int, result: str) -> None:
        """Record a request's result (applied, superseded, refused: ...)."""
        self.db.conn().execute(
            "UPDATE control SET applied_at = ?, result = ? WHERE id = ?",
            (time.time(), result, control_id),
        )

    def control_requests(self, run_id: int, limit: int = 10) -> pd.DataFrame:
        """A run's newest requests first."""
        return self.db.frame(
            "SELECT * FROM control WHERE run_id = ? ORDER BY id DESC LIMIT ?", (run_id, limit))

    def control_result(self, control_id: int) -> tuple[float | None, str | None]:
        """(when it was applied, its result); (None, None) while pending."""
        row = self.db.conn().execute(
            "SELECT applied_at, result FROM control WHERE id = ?", (control_id,)
        ).fetchone()
        return (row[0], row[1]) if row else (None, None)
