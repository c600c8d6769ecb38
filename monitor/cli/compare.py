"""`python -m monitor compare A B [C D]` and `python -m monitor gc`: print only; the work is
monitor/assess/compare.py and Store.gc."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

INCONCLUSIVE = 3  # exit status: slower, but the host explains it (--strict: 1)


def _fmt(v: Any, spec: str) -> str:
    return "–" if v is None else spec.format(v)


def print_comparison(out: dict[str, Any]) -> None:
    runs = out["runs"]
    head = "".join(f"{'run ' + str(r['run_id']):>16}" for r in runs)
    print(f"{'':<24}{head}")
    for name, values in out["settings_diff"].items():
        print(f"{name:<24}" + "".join(f"{v!s:>16}" for v in values) + "   (differs)")
    same = ", ".join(f"{k}={v}" for k, v in out["settings_same"].items())
    print(f"same in all: {same}")
    from monitor.assess.compare import KPI_ROWS

    for key, label, spec in KPI_ROWS:
        k = out["kpis"][key]
        cells = "".join(f"{_fmt(v, spec):>16}" for v in k["values"])
        deltas = " ".join(f"{d:+.1%}" for d in (k.get("delta") or [])[1:] if d is not None)
        print(f"{label:<24}{cells}" + (f"   Δ {deltas}" if deltas else ""))
    gate = out["gate"]
    print({"regression": "REGRESSION: ", "inconclusive": ""}.get(gate["state"], "ok: ")
          + gate["text"])


def compare_command(args: argparse.Namespace) -> int:
    from monitor.assess.compare import CompareError, compare
    from monitor.manage.context import machine_context
    from monitor.store import Store, StoreError

    try:
        store = Store(args.db)
        try:
            out = compare(store, args.runs, machine_context(), args.max_regression_pct)
        finally:
            store.close()
    except (CompareError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, default=str))
    else:
        print_comparison(out)
    state = out["gate"]["state"]
    if state == "inconclusive":
        return 1 if args.strict else INCONCLUSIVE
    return 1 if state == "regression" else 0


def gc_command(args: argparse.Namespace) -> int:
    from monitor.store import Store, StoreError

    if args.keep_days is None and args.max_mb is None:
        print("error: say what to keep: --keep-days N or --max-mb M", file=sys.stderr)
        return 2
    try:
        store = Store(args.db)
        removed, before, after = store.gc(args.keep_days, args.max_mb)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"removed {len(removed)} run(s) {removed if removed else ''}; the store went from "
          f"{before / 1e6:,.1f} MB to {after / 1e6:,.1f} MB")
    return 0
