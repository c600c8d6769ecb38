"""The SQLite store: the only channel between the workload, the collector and the page.

WAL mode lets one writer per process and any number of readers work at once; each thread gets
its own connection. Writers batch their rows (see probe.py and collector.py), so a killed
workload loses at most its last flush interval. Window queries return pandas DataFrames.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported on first read: a training script's probe only writes
    import pandas as pd

from monitor.records import RECORD_TABLES, as_row, columns, sql_type
from monitor.store.errors import StoreError, explain
from monitor.store.rollups import ROLLUP_SCHEMA, Rollups
from monitor.store.schema import SCHEMA
from monitor.store.shared import SharedState

DEFAULT_PATH = Path("runs") / "monitor.db"
ENV_VAR = "STARVATION_MONITOR_DB"

RUN_STATUSES = ("running", "finished", "stopped", "failed")
# A calibrated preset step is reused for this long, so runs compared one after another (the
# CLI, a sweep, the page's restarts) meet the same simulated device.
CALIBRATION_MAX_AGE_S = 6 * 3600

def default_path() -> Path:
    """The store's path: $STARVATION_MONITOR_DB, else runs/monitor.db."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


class Store(SharedState, Rollups):
    """Thread-safe access to one SQLite file (a connection per thread)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        """Open (or create) the store; StoreError, with nothing left behind, when the path
        cannot be one."""
        self.path = Path(path) if path is not None else default_path()
        self._local = threading.local()
        made = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        existed = self.path.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._init_schema()
            self._inode = os.stat(self.path).st_ino
        except (sqlite3.Error, OSError, RuntimeError) as exc:
            self.close()
            if not existed:  # nothing created: not the file, not its folders
                for suffix in ("", "-wal", "-shm", "-journal"):
                    with contextlib.suppress(OSError):
                        Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                for d in made:
                    with contextlib.suppress(OSError):
                        d.rmdir()
            raise StoreError(explain(self.path, exc)) from None

    def check(self) -> None:
        """Raise StoreError when the file was deleted or replaced since it was opened (a
        connection would go on writing into the deleted file, unseen)."""
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            ino = None
        if ino != self._inode:
            raise StoreError(f"the store {self.path} was deleted or replaced while recording: "
                             "what follows cannot be saved; keep the store where nothing "
                             "cleans it up (--db)")

    # -- connections -------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 10000")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _init_schema(self) -> None:
        conn = self._conn()
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(
                f"cannot put {self.path} in WAL mode (got {mode!r}); place the store on a "
                "local disk (--db or $STARVATION_MONITOR_DB)"
            )
        conn.executescript(SCHEMA + ROLLUP_SCHEMA)
        have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        for col in ("device", "accelerator_kind"):  # columns added since 0.1
            if col not in have:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {col} TEXT")
        if "device" not in {r[1] for r in conn.execute("PRAGMA table_info(ranks)")}:
            conn.execute("ALTER TABLE ranks ADD COLUMN device TEXT")
        for table, rec in RECORD_TABLES.items():
            cols = ", ".join(f"{f.name} {sql_type(str(f.type))}" for f in fields(rec))
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols})")
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            for f in fields(rec):  # a newer schema adds columns to an older file
                if f.name not in have:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {f.name} {sql_type(str(f.type))}")
        conn.execute("CREATE INDEX IF NOT EXISTS steps_run ON steps(run_id, ts)")
        conn.execute("CREATE INDEX IF NOT EXISTS host_ts ON host_samples(ts)")
        conn.execute("CREATE INDEX IF NOT EXISTS gpu_ts ON gpu_samples(ts)")
        conn.execute("CREATE INDEX IF NOT EXISTS gpu_util_ts ON gpu_util(ts)")

    # -- writes ------------------------------------------------------------------------
    def insert(self, records: Sequence[Any]) -> int:
        """Insert records of one type in one transaction; returns the count."""
        if not records:
            return 0
        rec_type = type(records[0])
        table = next(t for t, r in RECORD_TABLES.items() if r is rec_type)
        names = columns(rec_type)
        sql = f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
        self.check()
        conn = self._conn()
        try:
            with conn:
                conn.execute("BEGIN")
                conn.executemany(sql, [as_row(r) for r in records])
        except sqlite3.Error as exc:
            raise StoreError(explain(self.path, exc)) from exc
        return len(records)

    def create_run(
        self, name: str, kind: str, config: dict[str, Any], accelerator: str | None = None
    ) -> int:
        cur = self._conn().execute(
            "INSERT INTO runs (name, kind, config, accelerator, status, started_at) "
            "VALUES (?, ?, ?, ?, 'running', ?)",
            (name, kind, json.dumps(config, sort_keys=True), accelerator, time.time()),
        )
        return int(cur.lastrowid)

    def update_run(self, run_id: int, **values: Any) -> None:
        allowed = {"pid", "accelerator", "accelerator_kind", "config", "name", "device"}
        bad = set(values) - allowed
        if bad:
            raise ValueError(f"cannot update run fields {sorted(bad)}")
        for k, v in values.items():
            if k in ("config", "device") and not isinstance(v, str) and v is not None:
                values[k] = json.dumps(v, sort_keys=True)
        sets = ", ".join(f"{k} = ?" for k in values)
        self._conn().execute(f"UPDATE runs SET {sets} WHERE id = ?", (*values.values(), run_id))

    def import_run(self, run: dict[str, Any], frames: dict[str, Any]) -> int:
        """Insert a run record and its rows (monitor/export/files.py) in one transaction, as
        a new run; a run exported while running comes in stopped. Returns the new id."""
        status = run.get("status") if run.get("status") != "running" else "stopped"
        error = run.get("error") if run.get("status") != "running" else \
            "exported while it was running"
        conn = self._conn()
        try:
            with conn:
                conn.execute("BEGIN")
                cur = conn.execute(
                    "INSERT INTO runs (name, kind, config, accelerator, accelerator_kind, "
                    "device, status, error, started_at, ended_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run["name"], run["kind"], json.dumps(run.get("config") or {}),
                     run.get("accelerator"), run.get("accelerator_kind"),
                     json.dumps(run["device"]) if run.get("device") else None, status, error,
                     run["started_at"], run.get("ended_at") or run["started_at"]))
                new = int(cur.lastrowid)
                for table, df in frames.items():
                    if "run_id" in df.columns:
                        df = df.assign(run_id=new)
                    self._insert_frame(conn, table, df)
        except sqlite3.Error as exc:
            raise StoreError(explain(self.path, exc)) from exc
        return new

    @staticmethod
    def _insert_frame(conn: sqlite3.Connection, table: str, df: Any) -> None:
        have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[1] != "id"]
        cols = [c for c in df.columns if c in have]
        if df.empty or not cols:
            return
        rows = df[cols].astype(object).where(df[cols].notna(), None).itertuples(
            index=False, name=None)
        conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
                         f"({', '.join('?' * len(cols))})", list(rows))

    def close_orphans(self, alive: Any = None, grace_s: float = 60.0) -> list[int]:
        """Fail every `running` run whose recording process is gone (a dashboard or CLI
        that was killed): it can never end by itself. `alive(pid) -> bool` is injected for
        tests. Returns the runs closed."""
        if alive is None:
            def alive(pid: int) -> bool:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return False
                except PermissionError:
                    return True
                return True
        rows = self._conn().execute(
            "SELECT id, pid, started_at FROM runs WHERE status = 'running'").fetchall()
        closed = []
        for run_id, pid, started in rows:
            gone = (not alive(int(pid))) if pid else time.time() - started > grace_s
            if gone and self.finish_run(run_id, "failed", "the process recording this run "
                                        "is gone (killed before it could end the run)"):
                closed.append(run_id)
        return closed

    def finish_run(self, run_id: int, status: str, error: str | None = None) -> bool:
        """Mark a running run ended. The first writer wins: a later call (say the session
        manager's reaper after the workload already reported its own error) changes nothing
        and returns False."""
        if status not in RUN_STATUSES or status == "running":
            raise ValueError(f"bad final status {status!r}")
        cur = self._conn().execute(
            "UPDATE runs SET status = ?, error = ?, ended_at = ? "
            "WHERE id = ? AND status = 'running'",
            (status, error, time.time(), run_id),
        )
        return cur.rowcount == 1

    def add_event(
        self, run_id: int, kind: str, label: str, data: dict[str, Any] | None = None,
        ts: float | None = None,
    ) -> None:
        self._conn().execute(
            "INSERT INTO events (run_id, ts, kind, label, data) VALUES (?, ?, ?, ?, ?)",
            (run_id, ts if ts is not None else time.time(), kind, label,
             json.dumps(data, sort_keys=True) if data is not None else None),
        )

    def calibration(self, key: str, max_age_s: float = CALIBRATION_MAX_AGE_S) -> float | None:
        row = self._conn().execute("SELECT value, ts FROM calibration WHERE key = ?",
                                   (key,)).fetchone()
        return float(row[0]) if row and time.time() - row[1] <= max_age_s else None

    def set_calibration(self, key: str, value: float) -> None:
        self._conn().execute("INSERT OR REPLACE INTO calibration (key, value, ts) "
                             "VALUES (?, ?, ?)", (key, value, time.time()))

    # -- control: page/CLI -> workload ---------------------------------------------------
    def request_control(self, run_id: int, kind: str, payload: dict[str, Any] | None = None) -> int:
        cur = self._conn().execute(
            "INSERT INTO control (run_id, ts, kind, payload) VALUES (?, ?, ?, ?)",
            (run_id, time.time(), kind, json.dumps(payload) if payload is not None else None),
        )
        return int(cur.lastrowid)

    def pending_control(self, run_id: int, after_id: int = 0) -> list[tuple[int, str, Any]]:
        """Control requests for a run newer than `after_id`, oldest first."""
        rows = self._conn().execute(
            "SELECT id, kind, payload FROM control WHERE run_id = ? AND id > ? "
            "AND applied_at IS NULL ORDER BY id",
            (run_id, after_id),
        ).fetchall()
        return [(i, k, json.loads(p) if p else None) for i, k, p in rows]

    def mark_control(self, control_id: int, result: str) -> None:
        self._conn().execute(
            "UPDATE control SET applied_at = ?, result = ? WHERE id = ?",
            (time.time(), result, control_id),
        )

    def control_requests(self, run_id: int, limit: int = 10) -> pd.DataFrame:
        return self._frame("SELECT * FROM control WHERE run_id = ? ORDER BY id DESC LIMIT ?",
                           (run_id, limit))

    def control_result(self, control_id: int) -> tuple[float | None, str | None]:
        row = self._conn().execute(
            "SELECT applied_at, result FROM control WHERE id = ?", (control_id,)
        ).fetchone()
        return (row[0], row[1]) if row else (None, None)

    # -- reads -------------------------------------------------------------------------
    def _frame(self, sql: str, params: Iterable[Any] = ()) -> pd.DataFrame:
        import pandas as pd

        return pd.read_sql_query(sql, self._conn(), params=tuple(params))

    def runs(self, limit: int = 200) -> pd.DataFrame:
        return self._frame("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,))

    def live_state(self) -> tuple[int | None, tuple[int, ...]]:
        """(the newest run's id, the ids of running runs, newest first): one cheap query the
        page polls every second to notice a run that started elsewhere."""
        conn = self._conn()
        newest = conn.execute("SELECT MAX(id) FROM runs").fetchone()[0]
        live = conn.execute("SELECT id FROM runs WHERE status = 'running' ORDER BY id DESC"
                            ).fetchall()
        return (int(newest) if newest is not None else None), tuple(int(r[0]) for r in live)

    def resolve_run(self, spec: str) -> int | None:
        """A run id from `N`, `latest`, `latest~K` (K runs before the latest) or `name:NAME`
        (the latest run of that name); None when there is no such run."""
        spec = spec.strip()
        conn = self._conn()
        if spec.isdigit():
            row = conn.execute("SELECT id FROM runs WHERE id = ?", (int(spec),)).fetchone()
        elif spec == "latest" or spec.startswith("latest~") and spec[7:].isdigit():
            back = int(spec[7:]) if spec != "latest" else 0
            row = conn.execute("SELECT id FROM runs ORDER BY id DESC LIMIT 1 OFFSET ?",
                               (back,)).fetchone()
        elif spec.startswith("name:"):
            row = conn.execute("SELECT id FROM runs WHERE name = ? ORDER BY id DESC LIMIT 1",
                               (spec[5:],)).fetchone()
        else:
            row = None
        return int(row[0]) if row else None

    def run(self, run_id: int) -> dict[str, Any] | None:
        df = self._frame("SELECT * FROM runs WHERE id = ?", (run_id,))
        if df.empty:
            return None
        row = df.iloc[0].to_dict()
        row["config"] = json.loads(row["config"])
        dev = row.get("device")
        row["device"] = json.loads(dev) if isinstance(dev, str) else None
        return row

    def steps(
        self, run_id: int, since: float | None = None, until: float | None = None
    ) -> pd.DataFrame:
        return self._frame(
            "SELECT * FROM steps WHERE run_id = ? AND ts >= ? AND ts <= ? ORDER BY ts",
            (run_id, since if since is not None else 0.0, until if until is not None else 1e18),
        )

    def step_totals(self, run_ids: Sequence[int]) -> dict[int, dict[str, float]]:
        """Per run: steps, samples and the sums of wait, compute and both (the exporter's
        counters), in one query."""
        if not run_ids:
            return {}
        rows = self._conn().execute(
            "SELECT run_id, COUNT(*), SUM(samples), SUM(wait_s), SUM(compute_s) FROM steps "
            f"WHERE run_id IN ({', '.join('?' * len(run_ids))}) GROUP BY run_id",
            tuple(run_ids)).fetchall()
        return {int(r): {"steps": n, "samples": s or 0, "data_wait_seconds": w or 0.0,
                         "compute_seconds": c or 0.0, "step_seconds": (w or 0.0) + (c or 0.0)}
                for r, n, s, w, c in rows}

    def last_step_ts(self, run_id: int) -> float | None:
        row = self._conn().execute("SELECT MAX(ts) FROM steps WHERE run_id = ?",
                                   (run_id,)).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def host_samples(self, since: float, until: float | None = None,
                     bucket_s: float | None = None) -> pd.DataFrame:
        """Host rows over [since, until]; with `bucket_s`, one row per bucket (means; the
        last per-core reading) for charts of long windows."""
        return self._rows("host_samples", since, until, bucket_s, ("run_id", "rank"))

    def gpu_samples(self, since: float, until: float | None = None,
                    bucket_s: float | None = None) -> pd.DataFrame:
        return self._rows("gpu_samples", since, until, bucket_s, ("gpu",))

    def gpu_util(self, since: float, until: float | None = None,
                 bucket_s: float | None = None) -> pd.DataFrame:
        """Every NVML utilization sample; with `bucket_s`, each bucket's highest (a chart
        of a day keeps the peaks)."""
        return self._rows("gpu_util", since, until, bucket_s, ("gpu",), agg="MAX")

    def _rows(self, table: str, since: float, until: float | None, bucket_s: float | None,
              keys: tuple[str, ...], agg: str = "AVG") -> pd.DataFrame:
        params = (since, until if until is not None else 1e18)
        if not bucket_s:
            return self._frame(f"SELECT * FROM {table} WHERE ts >= ? AND ts <= ? ORDER BY ts",
                               params)
        info = self._conn().execute(f"PRAGMA table_info({table})").fetchall()
        cols = []
        for _, name, typ, *_ in info:
            if name == "ts":
                cols.append(f"CAST(ts / {bucket_s!r} AS INTEGER) * {bucket_s!r} AS ts")
            elif name in keys:
                cols.append(name)
            else:
                cols.append(f"{agg if typ in ('REAL', 'INTEGER') else 'MAX'}({name}) AS {name}")
        group = ", ".join(("CAST(ts / ? AS INTEGER)", *keys))
        return self._frame(f"SELECT {', '.join(cols)} FROM {table} WHERE ts >= ? AND ts <= ? "
                           f"GROUP BY {group} ORDER BY 1", (*params, bucket_s))

    def events(self, run_id: int, since: float | None = None,
               kinds: tuple[str, ...] | None = None) -> pd.DataFrame:
        sql, params = "SELECT * FROM events WHERE run_id = ? AND ts >= ?", [
            run_id, since if since is not None else 0.0]
        if kinds:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params += list(kinds)
        return self._frame(sql + " ORDER BY ts, id", params)

    def integrity_ok(self) -> bool:
        return self._conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
