"""Per-second rollups of a run's steps, so that hours-long runs chart fast.

`step_seconds` (schema.py) holds, per run, rank and wall-clock second: steps, samples,
Σ wait, Σ compute, and the longest wait and compute of a step in that second (what keeps a
sawtooth's troughs and peaks when a chart shows a whole day). It is derived, never written by
the probe: a reader brings it up to date before reading (`step_seconds`), recomputing only
the seconds since the last roll-up, so the training process pays nothing for it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.store.db import Db

if TYPE_CHECKING:
    import pandas as pd


class Rollups:
    """Owns `step_seconds`, derived from `steps`."""
    db: Db  # the Store's file (core.py: the Store is made of these parts)

    def roll_up(self, run_id: int) -> None:
        """Bring the run's rollup up to date: the last rolled second again (it may have been
        partial) and every second after it."""
        conn = self.db.conn()
        last = conn.execute("SELECT MAX(sec) FROM step_seconds WHERE run_id = ?",
                            (run_id,)).fetchone()[0]
        since = float(last) if last is not None else 0.0
        with conn:
            conn.execute("BEGIN")
            conn.execute(
                "INSERT OR REPLACE INTO step_seconds SELECT run_id, COALESCE(rank, 0), "
                "CAST(ts AS INTEGER) AS sec, COUNT(*), SUM(samples), SUM(wait_s), "
                "SUM(compute_s), MAX(wait_s), MAX(compute_s) FROM steps "
                "WHERE run_id = ? AND ts >= ? GROUP BY COALESCE(rank, 0), sec",
                (run_id, since))

    def step_seconds(self, run_id: int, since: float | None = None,
                     until: float | None = None) -> pd.DataFrame:
        """The run's per-second rollup over [since, until], brought up to date first."""
        self.roll_up(run_id)
        return self.db.frame(
            "SELECT * FROM step_seconds WHERE run_id = ? AND sec >= ? AND sec <= ? "
            "ORDER BY sec, rank",
            (run_id, int(since or 0), int(until if until is not None else 1e12)))
