"""The Compare tab's figures table (no streamlit: a frame built from compare()'s output)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from monitor.assess.compare import KPI_ROWS


def kpi_table(out: dict[str, Any], runs: list[int]) -> pd.DataFrame:
    """One row per figure, a column per run, each with its delta against the first run."""
    rows = {}
    for key, label, spec in KPI_ROWS:
        k = out["kpis"][key]
        deltas = k.get("delta") or [None] * len(runs)
        rows[label] = ["–" if v is None else spec.format(v) + (
            f" ({d:+.1%})" if d is not None and i > 0 else "")
            for i, (v, d) in enumerate(zip(k["values"], deltas, strict=True))]
    return pd.DataFrame(rows, index=[f"run {r}" for r in runs]).T
