"""The `runs` table and the `ranks` table: a run's life (created running, ended once, an
orphan closed), lookups by id, name or `latest~K`, and a distributed job's one run and its
ranks."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monitor.store.db import Db, insert_frame
from monitor.store.errors import StoreError, explain
from monitor.store.notes import Notes

if TYPE_CHECKING:
    import pandas as pd

# the run vocabularies, owned here and imported by the rest (monitor.store exports them)
RUNNING, FINISHED, STOPPED, FAILED = "running", "finished", "stopped", "failed"
RUN_STATUSES = (RUNNING, FINISHED, STOPPED, FAILED)
MANAGED, ATTACHED = "managed", "attached"  # our workload; a user's script under the probe
RUN_KINDS = (MANAGED, ATTACHED)
UPDATABLE = ("pid", "accelerator", "accelerator_kind", "config", "name", "device", "identity")


def _pid_alive(pid: int) -> bool:
    """A process that can still record: not gone, and not a zombie (a killed script whose
    parent died too waits to be reaped, dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


class Runs:
    """Owns `runs` and `ranks` (and the job key a distributed job's ranks share, in meta)."""
    db: Db  # the Store's file (core.py: the Store is made of these parts)
    notes: Notes

    # -- a run's life ----------------------------------------------------------------------
    def create_run(self, name: str, kind: str, config: dict[str, Any],
                   accelerator: str | None = None) -> int:
        """A new run, `running` from now; returns its id."""
        cur = self.db.conn().execute(
            "INSERT INTO runs (name, kind, config, accelerator, status, started_at) "
            "VALUES (?, ?, ?, ?, 'running', ?)",
            (name, kind, json.dumps(config, sort_keys=True), accelerator, time.time()),
        )
        return int(cur.lastrowid)

    def update_run(self, run_id: int, **values: Any) -> None:
        """Set some of a run's fields (UPDATABLE); config and device given as dicts."""
        bad = set(values) - set(UPDATABLE)
        if bad:
            raise ValueError(f"cannot update run fields {sorted(bad)}")
        for k, v in values.items():
            if k in ("config", "device") and not isinstance(v, str) and v is not None:
                values[k] = json.dumps(v, sort_keys=True)
        sets = ", ".join(f"{k} = ?" for k in values)
        self.db.conn().execute(f"UPDATE runs SET {sets} WHERE id = ?",
                               (*values.values(), run_id))

    def finish_run(self, run_id: int, status: str, error: str | None = None) -> bool:
        """Mark a running run ended. The first writer wins: a later call (say the session
        manager's reaper after the workload already reported its own error) changes nothing
        and returns False."""
        if status not in RUN_STATUSES or status == RUNNING:
            raise ValueError(f"bad final status {status!r}")
        cur = self.db.conn().execute(
            "UPDATE runs SET status = ?, error = ?, ended_at = ? "
            "WHERE id = ? AND status = 'running'",
            (status, error, time.time(), run_id),
        )
        return cur.rowcount == 1

    def close_orphans(self, alive: Callable[[int], bool] | None = None,
                      grace_s: float = 60.0, later_if_locked: bool = False) -> list[int]:
        """Fail every `running` run whose recording process is gone (a dashboard or CLI
        that was killed): it can never end by itself; with the reason that process noted
        when it could not write it here (notes.py), else "the process is gone".
        `alive(pid) -> bool` is injected for tests. Returns the runs closed.
        `later_if_locked`: a store another writer holds locked past its busy timeout
        leaves them for the next open (`monitor run` died there once, "database is
        locked", and its script with it) instead of raising."""
        try:
            return self._close_orphans(alive or _pid_alive, grace_s)
        except sqlite3.OperationalError as exc:
            if later_if_locked and any(w in str(exc).lower() for w in ("locked", "busy")):
                return []
            raise

    def _close_orphans(self, alive: Callable[[int], bool], grace_s: float) -> list[int]:
        rows = self.db.conn().execute(
            "SELECT id, pid, started_at FROM runs WHERE status = 'running'").fetchall()
        gone = [run_id for run_id, pid, started in rows
                if ((not alive(int(pid))) if pid else time.time() - started > grace_s)]
        noted = self.notes.take(gone) if gone else {}
        closed = []
        for run_id in gone:
            why = noted.get(run_id) or ("the process recording this run is gone (killed "
                                        "before it could end the run)")
            if self.finish_run(run_id, "failed", why):
                closed.append(run_id)
        return closed

    def import_run(self, run: dict[str, Any], frames: dict[str, Any]) -> int:
        """Insert a run record and its rows (monitor/export/files.py) in one transaction, as
        a new run; a run exported while running comes in stopped. Returns the new id."""
        status = run.get("status") if run.get("status") != RUNNING else STOPPED
        error = run.get("error") if run.get("status") != RUNNING else \
            "exported while it was running"
        conn = self.db.conn()
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
                    insert_frame(conn, table, df)
        except sqlite3.Error as exc:
            raise StoreError(explain(self.db.path, exc)) from exc
        return new

    # -- reads ------------------------------------------------------------------------------
    def runs(self, limit: int = 200) -> pd.DataFrame:
        """The newest runs first."""
        return self.db.frame("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,))

    def run(self, run_id: int) -> dict[str, Any] | None:
        """One run's row, config and device parsed; None when there is no such run."""
        try:
            key = int(run_id)  # numpy's ints too (sqlite3 binds Python's alone)
        except (TypeError, ValueError):
            return None
        row = self.db.row("SELECT * FROM runs WHERE id = ?", (key,))
        return _parsed_run(row) if row is not None else None

    def shown_runs(self, ended_since: float, limit: int = 200) -> list[dict[str, Any]]:
        """Of the newest `limit` runs, those running or ended since `ended_since`, newest
        first, parsed as run() parses one (no DataFrame: the exporter reads them at each
        scrape)."""
        cur = self.db.conn().execute(
            "SELECT * FROM (SELECT * FROM runs ORDER BY id DESC LIMIT ?) WHERE status = ? "
            "OR ended_at >= ? ORDER BY id DESC", (limit, RUNNING, ended_since))
        names = [d[0] for d in cur.description]
        return [_parsed_run(dict(zip(names, r, strict=True))) for r in cur.fetchall()]

    def live_state(self) -> tuple[int | None, tuple[int, ...]]:
        """(the newest run's id, the ids of running runs, newest first): one cheap query the
        page polls every second to notice a run that started elsewhere."""
        conn = self.db.conn()
        newest = conn.execute("SELECT MAX(id) FROM runs").fetchone()[0]
        live = conn.execute("SELECT id FROM runs WHERE status = 'running' ORDER BY id DESC"
                            ).fetchall()
        return (int(newest) if newest is not None else None), tuple(int(r[0]) for r in live)

    def resolve_run(self, spec: str) -> int | None:
        """A run id from `N`, `latest`, `latest~K` (K runs before the latest) or `name:NAME`
        (the latest run of that name); None when there is no such run."""
        spec = spec.strip()
        conn = self.db.conn()
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

    def previous_run(self, run_id: int) -> int | None:
        """The run stored just before `run_id` (the report's comparison), None if none."""
        row = self.db.conn().execute("SELECT MAX(id) FROM runs WHERE id < ?",
                                     (int(run_id),)).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def judged_before(self, identity: str, run_id: int, kind: str) -> list[dict[str, Any]]:
        """The `kind` event's data (the verdict's line as each ended: assess/same_runs.py)
        of the runs before `run_id` with the same identity, oldest first."""
        rows = self.db.conn().execute(
            "SELECT e.run_id, e.data FROM events e JOIN runs r ON r.id = e.run_id "
            "WHERE r.identity = ? AND r.id < ? AND e.kind = ? ORDER BY r.id, e.id",
            (identity, int(run_id), kind)).fetchall()
        return [{**_json_or(d, dict), "run": int(i)} for i, d in rows]

    # -- a distributed job ------------------------------------------------------------------
    def job_run(self, key: str, name: str, config: dict[str, Any]) -> int:
        """The one run of a distributed job, by a key its ranks share (launcher's run id and
        host): the first rank to ask creates it, the others get the same id."""
        conn = self.db.conn()
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

    def set_rank(self, run_id: int, rank: int, local_rank: int | None, world_size: int,
                 hostname: str, pid: int, config: dict[str, Any] | None = None,
                 accelerator_kind: str | None = None,
                 device: dict[str, Any] | None = None, job_id: str | None = None,
                 node_rank: int | None = None, nodes: int | None = None,
                 placement: dict[str, str] | None = None) -> None:
        """What one rank's probe says of itself (at its first epoch, and after changes);
        `device`: its CUDA device as the collector finds it in NVML (uuid, pci, index);
        `job_id`: the same on every node of the job, `nodes` how many; `placement`: the
        scheduler's names for it (hpc_job, pod, namespace, replica: probe/identity.py)."""
        self.db.conn().execute(
            "INSERT OR REPLACE INTO ranks (run_id, rank, local_rank, world_size, hostname, pid,"
            " config, accelerator_kind, device, job_id, node_rank, nodes, placement, ts) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, rank, local_rank, world_size, hostname, pid,
             json.dumps(config, sort_keys=True) if config is not None else None,
             accelerator_kind, json.dumps(device) if device else None, job_id, node_rank,
             nodes, json.dumps(placement, sort_keys=True) if placement else None,
             time.time()))

    def ranks(self, run_id: int) -> pd.DataFrame:
        """One row per rank that has reported, by rank; `config`, `device` and `placement`
        parsed (read_sql types the numeric columns: NaN where a rank has not said)."""
        df = self.db.frame("SELECT * FROM ranks WHERE run_id = ? ORDER BY rank", (run_id,))
        for k, empty in _RANK_JSON:
            if not df.empty:
                df[k] = [_json_or(v, empty) for v in df[k]]
        return df

    def rank_records(self, run_id: int) -> list[dict[str, Any]]:
        """ranks() as dicts, no DataFrame (the exporter's read at each scrape)."""
        cur = self.db.conn().execute("SELECT * FROM ranks WHERE run_id = ? ORDER BY rank",
                                     (run_id,))
        names = [d[0] for d in cur.description]
        out = []
        for r in cur.fetchall():
            row = dict(zip(names, r, strict=True))
            for k, empty in _RANK_JSON:
                row[k] = _json_or(row[k], empty)
            out.append(row)
        return out


# the ranks table's JSON columns, and what a rank that has not said reads as
_RANK_JSON: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("config", dict), ("device", lambda: None), ("placement", dict))


def _json_or(value: Any, empty: Callable[[], Any]) -> Any:
    return json.loads(value) if isinstance(value, str) else empty()


def _parsed_run(row: dict[str, Any]) -> dict[str, Any]:
    """A runs row with its config and device parsed."""
    row["config"] = json.loads(row["config"])
    dev = row.get("device")
    row["device"] = json.loads(dev) if isinstance(dev, str) else None
    return row
