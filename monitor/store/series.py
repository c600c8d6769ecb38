"""The time series: `steps`, `host_samples`, `gpu_samples`, `gpu_util` (record tables,
monitor/records.py) and `events`. Writers batch their rows (the probe and the collector), so
a killed workload loses at most its last flush interval; window reads return DataFrames, and
long windows come bucketed in SQL."""
from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from monitor.records import RECORD_TABLES, as_row, columns
from monitor.store.db import Db
from monitor.store.errors import StoreError, explain

if TYPE_CHECKING:
    import pandas as pd

END_OF_TIME = 1e18
# SQLite's bound on a statement's parameters: 32,766 since 3.32, 999 before
MAX_PARAMS = 32_000 if sqlite3.sqlite_version_info >= (3, 32) else 999


class Series:
    """Owns the record tables and `events`."""
    db: Db  # the Store's file (core.py: the Store is made of these parts)

    def insert(self, records: Sequence[Any]) -> int:
        """Insert records of one type in one transaction; returns the count."""
        if not records:
            return 0
        return self.insert_rows(type(records[0]), [as_row(r) for r in records])

    def insert_rows(self, rec_type: type, rows: Sequence[tuple]) -> int:
        """Rows already in `rec_type`'s column order, in one transaction, many rows a
        statement: each statement is one step of SQLite's, one release of the GIL (a
        writer thread beside a busy training thread waits for the GIL each time it takes
        it back: a row a step made the probe's writer fall seconds behind)."""
        if not rows:
            return 0
        table = next(t for t, r in RECORD_TABLES.items() if r is rec_type)
        names = columns(rec_type)
        per = max(1, MAX_PARAMS // len(names))
        one = f"({', '.join('?' * len(names))})"
        head = f"INSERT INTO {table} ({', '.join(names)}) VALUES "
        conn = self.db.conn()
        with self.batch():  # (the caller's, where one is open)
            try:
                for i in range(0, len(rows), per):
                    chunk = rows[i:i + per]
                    conn.execute(head + ", ".join([one] * len(chunk)),
                                 [v for row in chunk for v in row])
            except sqlite3.Error as exc:
                raise StoreError(explain(self.db.path, exc)) from exc
        return len(rows)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The writes inside it in one transaction, committed at its end and rolled back
        whole where one fails (a StoreError that names the path and the fix): one commit a
        relay cycle for its events and rows, not one an event (each commit of WAL mode ~0.1
        ms here). Inside another batch it is that one's."""
        conn = self.db.conn()
        if conn.in_transaction:
            yield
            return
        self.db.check()
        try:
            with conn:
                conn.execute("BEGIN")
                yield
        except sqlite3.Error as exc:
            raise StoreError(explain(self.db.path, exc)) from exc

    def add_event(self, run_id: int, kind: str, label: str,
                  data: dict[str, Any] | None = None, ts: float | None = None) -> None:
        """One event of a run (a settings change, a stall, a probe note); a failed write is
        a StoreError that names the path and the fix, as the rows' are."""
        try:
            self.db.conn().execute(
                "INSERT INTO events (run_id, ts, kind, label, data) VALUES (?, ?, ?, ?, ?)",
                (run_id, ts if ts is not None else time.time(), kind, label,
                 json.dumps(data, sort_keys=True) if data is not None else None),
            )
        except sqlite3.Error as exc:
            raise StoreError(explain(self.db.path, exc)) from exc

    def events(self, run_id: int, since: float | None = None,
               kinds: tuple[str, ...] | None = None) -> pd.DataFrame:
        """A run's events since `since`, of some kinds, in order."""
        sql, params = "SELECT * FROM events WHERE run_id = ? AND ts >= ?", [
            run_id, since if since is not None else 0.0]
        if kinds:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params += list(kinds)
        return self.db.frame(sql + " ORDER BY ts, id", params)

    def steps(self, run_id: int, since: float | None = None,
              until: float | None = None) -> pd.DataFrame:
        """A run's steps over [since, until], in time order."""
        return self.db.frame(
            "SELECT * FROM steps WHERE run_id = ? AND ts >= ? AND ts <= ? ORDER BY ts",
            (run_id, since if since is not None else 0.0,
             until if until is not None else END_OF_TIME),
        )

    def first_steps(self, run_id: int, n: int) -> pd.DataFrame:
        """A run's first `n` steps, in time order (its warm-up)."""
        return self.db.frame("SELECT * FROM steps WHERE run_id = ? ORDER BY ts LIMIT ?",
                             (run_id, n))

    def rank_totals(self, run_ids: Sequence[int], after: Mapping[int, int] | None = None
                    ) -> dict[tuple[int, int], dict[str, float]]:
        """Per (run, rank): steps, samples and the sums of wait, compute and both (the
        exporter's counters), when its first step began (`first_ts`, the counters' created
        time) and its last row's rowid (`last_row`), in one query; a run without ranks is
        rank 0. `after` (run -> rowid): only the rows past it, for a reader that keeps the
        sums (a step's rowid is above every row already committed: rows are never updated)."""
        if not run_ids:
            return {}
        head = ("SELECT run_id, COALESCE(rank, 0), COUNT(*), SUM(samples), SUM(wait_s), "
                "SUM(compute_s), MIN(ts - wait_s), MAX(rowid) FROM steps ")
        group = " GROUP BY run_id, COALESCE(rank, 0)"
        marked = [r for r in run_ids if after is not None and r in after]
        fresh = [r for r in run_ids if r not in marked]
        conn, rows = self.db.conn(), []
        if fresh:  # every step of these runs, through the runs' index
            rows += conn.execute(head + f"WHERE run_id IN ({', '.join('?' * len(fresh))})"
                                 + group, fresh).fetchall()
        if marked:  # the rowids past the oldest mark (NOT INDEXED: the runs' index would
            # walk every step the runs ever had)
            rows += conn.execute(head + "NOT INDEXED WHERE rowid > ? AND (" + " OR ".join(
                "(run_id = ? AND rowid > ?)" for _ in marked) + ")" + group, [
                min(after[r] for r in marked), *(v for r in marked for v in (r, after[r]))]
            ).fetchall()
        return {(int(r), int(k)): {"steps": n, "samples": s or 0, "data_wait_seconds": w or 0.0,
                                   "compute_seconds": c or 0.0,
                                   "step_seconds": (w or 0.0) + (c or 0.0), "first_ts": f,
                                   "last_row": m}
                for r, k, n, s, w, c, f, m in rows}

    def generation_total(self, run_id: int, seq: int, since: float, until: float,
                         rank: int | None = None, skip: int = 0) -> dict[str, float]:
        """One loader generation's (`config_seq`) steps between `since` and `until`, its
        first `skip` (warm-up) left out: steps, samples and the loop's seconds."""
        row = self.db.conn().execute(
            "SELECT COUNT(*), SUM(samples), SUM(wait_s + compute_s) FROM (SELECT samples, "
            "wait_s, compute_s FROM steps WHERE run_id = ? AND ts >= ? AND ts <= ? AND "
            "config_seq = ? AND (? IS NULL OR COALESCE(rank, 0) = ?) ORDER BY ts "
            "LIMIT -1 OFFSET ?)", (run_id, since, until, seq, rank, rank, skip)).fetchone()
        return {"steps": int(row[0] or 0), "samples": float(row[1] or 0.0),
                "loop_s": float(row[2] or 0.0)}

    def last_step_ts(self, run_id: int) -> float | None:
        """When the run's newest step ended; None before its first."""
        row = self.db.conn().execute("SELECT MAX(ts) FROM steps WHERE run_id = ?",
                                     (run_id,)).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def host_samples(self, since: float, until: float | None = None,
                     bucket_s: float | None = None) -> pd.DataFrame:
        """Host rows over [since, until]; with `bucket_s`, one row per bucket (means; the
        last per-core reading) for charts of long windows."""
        return self._rows("host_samples", since, until, bucket_s, ("run_id", "rank"))

    def host_last(self, run_id: int, since: float, until: float,
                  cols: Sequence[str]) -> dict[int | None, dict[str, Any]]:
        """Each rank's newest host row of the run over [since, until], `cols` of it (tuples,
        no DataFrame: the exporter reads this at every scrape), the workers' USS carried
        forward from the rank's last row that read it (read one sampler pass in 8; as
        frames.analysis.workers_memory_mb). Keyed as frames.analysis.rank_rows cuts: a row
        with no rank is rank 0's where any row has one; with none at all (the whole node's
        rows) the one key is None, every rank's."""
        cols = list(dict.fromkeys([*cols, "workers_uss_mb"]))
        rows = self.db.conn().execute(
            f"SELECT rank, {', '.join(cols)} FROM host_samples WHERE ts >= ? AND ts <= ? "
            "AND run_id = ? ORDER BY ts", (since, until, run_id)).fetchall()
        ranked = any(r[0] is not None for r in rows)
        out: dict[int | None, dict[str, Any]] = {}
        for rank, *vals in rows:
            key = (int(rank) if rank is not None else 0) if ranked else None
            row = dict(zip(cols, vals, strict=True))
            if row["workers_uss_mb"] is None and key in out:
                row["workers_uss_mb"] = out[key]["workers_uss_mb"]
            out[key] = row
        return out

    def gpu_samples(self, since: float, until: float | None = None,
                    bucket_s: float | None = None) -> pd.DataFrame:
        """Per-GPU samples over [since, until]; with `bucket_s`, bucket means."""
        return self._rows("gpu_samples", since, until, bucket_s, ("gpu",))

    def gpu_util(self, since: float, until: float | None = None,
                 bucket_s: float | None = None) -> pd.DataFrame:
        """Every NVML utilization sample; with `bucket_s`, each bucket's highest (a chart
        of a day keeps the peaks)."""
        return self._rows("gpu_util", since, until, bucket_s, ("gpu",), agg="MAX")

    def _rows(self, table: str, since: float, until: float | None, bucket_s: float | None,
              keys: tuple[str, ...], agg: str = "AVG") -> pd.DataFrame:
        params = (since, until if until is not None else END_OF_TIME)
        if not bucket_s:
            return self.db.frame(
                f"SELECT * FROM {table} WHERE ts >= ? AND ts <= ? ORDER BY ts", params)
        info = self.db.conn().execute(f"PRAGMA table_info({table})").fetchall()
        cols = []
        for _, name, typ, *_ in info:
            if name == "ts":
                cols.append(f"CAST(ts / {bucket_s!r} AS INTEGER) * {bucket_s!r} AS ts")
            elif name in keys:
                cols.append(name)
            else:
                cols.append(f"{agg if typ in ('REAL', 'INTEGER') else 'MAX'}({name}) AS {name}")
        group = ", ".join(("CAST(ts / ? AS INTEGER)", *keys))
        return self.db.frame(f"SELECT {', '.join(cols)} FROM {table} WHERE ts >= ? AND "
                             f"ts <= ? GROUP BY {group} ORDER BY 1", (*params, bucket_s))
