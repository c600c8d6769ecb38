"""A run as files, and back: steps, host samples, GPU samples, NVML utilization, events and
control requests as CSV or Parquet tables, plus run.json (the run record, its steady-state
assessment, and a checksum of its steps). `import_run` loads such a folder into a store as a
new run, so a colleague opens it in their dashboard.

Writes go to a temporary folder beside the target, renamed into place at the end: a failed
export leaves nothing half-written. The page's download buttons zip the same files.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import shutil
import tempfile
import time
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

from monitor.assess.window import Context, assess_run
from monitor.frames.analysis import run_rows, span
from monitor.records import RECORD_TABLES
from monitor.store import RUNNING, Store, StoreError

FORMATS = ("csv", "parquet")
FORMAT_VERSION = 1
TABLES = ("steps", "host_samples", "gpu_samples", "gpu_util", "events", "control", "ranks")
OPTIONAL = ("ranks",)  # tables an export of an older version may lack
RUN_FIELDS = ("name", "kind", "config", "accelerator", "accelerator_kind", "device", "status",
              "error", "started_at", "ended_at")


class ExportError(RuntimeError):
    """The export or import cannot be done; the message says why and what to do."""


def run_frames(store: Store, run_id: int) -> dict[str, pd.DataFrame]:
    """Every table's rows for one run (GPU rows over the run's span: they have no run)."""
    run = store.run(run_id)
    if run is None:
        raise ExportError(f"there is no run {run_id} in the store {store.path}: pick one "
                          "from the dashboard's run selector")
    steps = store.steps(run_id)
    start = run["started_at"]
    end = run["ended_at"] if run["status"] != RUNNING else time.time()
    if not steps.empty:  # the steps' own span, should the run record say otherwise
        first, last = span(steps)
        start, end = min(start, first), max(end, last)
    host = store.host_samples(start, end)
    return {
        "steps": steps,
        "host_samples": run_rows(host, run_id),
        "gpu_samples": store.gpu_samples(start, end),
        "gpu_util": store.gpu_util(start, end),
        "events": store.events(run_id).drop(columns=["id"]),
        "control": store.control_requests(run_id, limit=1_000_000).sort_values("id")
        .drop(columns=["id"]),
        "ranks": _stored_ranks(store, run_id),
    }


def _stored_ranks(store: Store, run_id: int) -> pd.DataFrame:
    """The run's ranks as the table holds them (config, device and placement as JSON
    text)."""
    df = store.ranks(run_id)
    if df.empty:
        return df
    return df.assign(config=[json.dumps(c) for c in df["config"]],
                     device=[json.dumps(d) if d is not None else None for d in df["device"]],
                     placement=[json.dumps(p) if p else None for p in df["placement"]])


def steps_checksum(steps: pd.DataFrame) -> str:
    """sha256 over the steps' values in schema order, run id left out (an import gives a new
    one): the same steps give the same checksum in any store."""
    cols = [f.name for f in fields(RECORD_TABLES["steps"]) if f.name != "run_id"]
    canon = steps.sort_values(["ts", "step"])[cols].astype(float).to_numpy()
    return hashlib.sha256(canon.tobytes()).hexdigest()


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def run_document(store: Store, run_id: int, frames: dict[str, pd.DataFrame],
                 ctx: Context) -> dict[str, Any]:
    run = store.run(run_id) or {}
    a = assess_run(store, run_id, ctx)
    return {
        "format": FORMAT_VERSION, "source_run_id": run_id,
        "run": {k: _plain(run.get(k)) for k in RUN_FIELDS},
        "summary": a.to_dict() if a is not None else None,
        "rows": {t: len(df) for t, df in frames.items()},
        "steps_sha256": steps_checksum(frames["steps"]),
    }


def _write_tables(folder: Path, frames: dict[str, pd.DataFrame], fmt: str) -> None:
    for table, df in frames.items():
        if fmt == "csv":
            df.to_csv(folder / f"{table}.csv", index=False)
        else:
            df.to_parquet(folder / f"{table}.parquet", index=False, engine="pyarrow")


def export_run(store: Store, run_id: int, out: Path, fmt: str, ctx: Context) -> Path:
    """Write run `run_id` to out/run-<id>-<fmt>/ and return that folder."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    frames = run_frames(store, run_id)
    target = Path(out) / f"run-{run_id}-{fmt}"
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=out))
    except OSError as exc:
        raise ExportError(f"cannot write to {out} ({exc.strerror or exc}): pass --out with a "
                          "folder you can write") from None
    try:
        _write_tables(tmp, frames, fmt)
        doc = run_document(store, run_id, frames, ctx)
        (tmp / "run.json").write_text(json.dumps(doc, indent=2, default=str))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except OSError as exc:
        raise ExportError(f"cannot write the export to {out} ({exc.strerror or exc}): free "
                          "space or pass --out with another folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def export_zip(db: str, run_id: int, fmt: str, ctx: Context) -> bytes:
    """The export's files as one zip (the page's download buttons)."""
    store = Store(db)
    try:
        with tempfile.TemporaryDirectory() as d:
            folder = export_run(store, run_id, Path(d), fmt, ctx)
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
                for f in sorted(folder.iterdir()):
                    z.write(f, f"{folder.name}/{f.name}")
            return buf.getvalue()
    finally:
        store.close()


def _read(folder: Path, table: str) -> pd.DataFrame:
    csv, parquet = folder / f"{table}.csv", folder / f"{table}.parquet"
    if parquet.exists():
        return pd.read_parquet(parquet, engine="pyarrow")
    if csv.exists():
        try:
            return pd.read_csv(csv)  # pandas 3 parses floats exactly (round trip)
        except pd.errors.EmptyDataError:
            return pd.DataFrame()
    if table in OPTIONAL:
        return pd.DataFrame()
    raise ExportError(f"{folder} has no {table}.csv or {table}.parquet: is it a folder "
                      "written by python -m monitor export?")


def import_run(store: Store, folder: Path) -> int:
    """Load an exported run into `store` as a new run; returns its id."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError) as exc:
        raise ExportError(f"{folder} is not a run export ({exc}): give the folder that "
                          "python -m monitor export wrote") from None
    frames = {t: _read(folder, t) for t in TABLES}
    if steps_checksum(frames["steps"]) != doc.get("steps_sha256"):
        raise ExportError(f"{folder}/steps does not match its checksum in run.json: the "
                          "export was changed or cut short; export it again")
    try:
        return store.import_run(doc["run"], frames)
    except StoreError:
        raise
    except Exception as exc:
        raise ExportError(f"cannot import {folder}: {exc}") from None
