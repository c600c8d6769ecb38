"""One SQLite file and its connections: a connection per thread (WAL mode lets one writer
per process and any number of readers work at once), the schema brought up to date on open,
and the two ways the tables read and write through it (`frame`, `insert_frame`)."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported on first read: a training script's probe only writes
    import pandas as pd

from monitor.records import RECORD_TABLES, sql_type
from monitor.store.errors import StoreError, explain
from monitor.store.schema import SCHEMA

# SQLite's answers to a connection that meets another process bringing the same new file
# up (Db._init_schema_shared), and how long they are tried again
TRANSIENT = ("database is locked", "disk I/O error")
INIT_RETRY_S = 3.0


class Db:
    """The file, its per-thread connections and its schema."""

    def __init__(self, path: Path) -> None:
        """Open (or create) the file; StoreError, with nothing left behind, when the path
        cannot be one."""
        self.path = path
        self._local = threading.local()
        made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
        created = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:  # made here, or by another process (`monitor run` and the page at once)
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                created = True
            except FileExistsError:
                pass
            self._init_schema_shared()
            self._inode = os.stat(path).st_ino
        except (sqlite3.Error, OSError, RuntimeError) as exc:
            self.close()
            if created:  # what this process made, and only that: never another's store
                for suffix in ("", "-wal", "-shm", "-journal"):
                    with contextlib.suppress(OSError):
                        Path(f"{path}{suffix}").unlink(missing_ok=True)
                for d in made:
                    with contextlib.suppress(OSError):
                        d.rmdir()
            raise StoreError(explain(path, exc)) from None

    def conn(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use)."""
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

    def frame(self, sql: str, params: Iterable[Any] = ()) -> pd.DataFrame:
        """A query's rows as a DataFrame."""
        import pandas as pd

        return pd.read_sql_query(sql, self.conn(), params=tuple(params))

    def row(self, sql: str, params: Iterable[Any] = ()) -> dict[str, Any] | None:
        """A query's first row as a dict (None: no row): a single row without building a
        DataFrame (~3 ms each; the page reads its run's row several times a refresh)."""
        cur = self.conn().execute(sql, tuple(params))
        row = cur.fetchone()
        return dict(zip((d[0] for d in cur.description), row, strict=True)) \
            if row is not None else None

    def size_bytes(self) -> int:
        """The file's size on disk with its write-ahead log."""
        return sum(p.stat().st_size for p in (self.path, self.path.with_name(
            self.path.name + "-wal")) if p.exists())

    def _init_schema_shared(self) -> None:
        """The schema, while other processes may be opening the same new file: SQLite
        answers a connection that meets another's switch to WAL "database is locked" or
        "disk I/O error" (3 processes opening one new file at once: 2 of 3 failed in 6 of
        100 tries), so those are tried again on a fresh connection for up to
        INIT_RETRY_S; any other error, or one that lasts, is the store's."""
        deadline = time.monotonic() + INIT_RETRY_S
        while True:
            try:
                return self._init_schema()
            except sqlite3.OperationalError as exc:
                if str(exc) not in TRANSIENT or time.monotonic() > deadline:
                    raise
                self.close()
                time.sleep(0.02)  # sleep-ok: a back-off before the next try, not a wait

    def _init_schema(self) -> None:
        conn = self.conn()
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(
                f"cannot put {self.path} in WAL mode (got {mode!r}); place the store on a "
                "local disk (--db or $STARVATION_MONITOR_DB)"
            )
        conn.executescript(SCHEMA)
        have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        for col in ("device", "accelerator_kind", "identity"):  # columns added since 0.1
            if col not in have:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {col} TEXT")
        have = {r[1] for r in conn.execute("PRAGMA table_info(ranks)")}
        for col, typ in (("device", "TEXT"), ("job_id", "TEXT"), ("node_rank", "INTEGER"),
                         ("nodes", "INTEGER"), ("placement", "TEXT")):
            if col not in have:  # columns added since 0.1
                conn.execute(f"ALTER TABLE ranks ADD COLUMN {col} {typ}")
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


def insert_frame(conn: sqlite3.Connection, table: str, df: Any) -> None:
    """Insert a DataFrame's rows into `table`: the columns both have (an import from an
    older or newer export), NaN as NULL."""
    have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[1] != "id"]
    cols = [c for c in df.columns if c in have]
    if df.empty or not cols:
        return
    rows = df[cols].astype(object).where(df[cols].notna(), None).itertuples(
        index=False, name=None)
    conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
                     f"({', '.join('?' * len(cols))})", list(rows))
