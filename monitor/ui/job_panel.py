"""The Job tab (`dashboard --prometheus URL`): a job whose ranks span nodes, read from the
Prometheus every node's exporter is scraped by (monitor/export/promread.py): the job's
throughput, a rank table with each rank's node, host, figures, verdict and loader settings,
the input straggler named with its node, and the per-rank wait per step. It refreshes by
itself; a node that joins appears at its first scrape."""
from __future__ import annotations

import math
import time

import pandas as pd
import streamlit as st

from monitor.config import LOADER_SETTINGS
from monitor.export import promread
from monitor.thresholds import STRAGGLER_MIN_S, STRAGGLER_RATIO
from monitor.ui import charts
from monitor.ui.text import plain

REFRESH_S = 2.0
TABLE_MAX = 64  # ranks shown as a table of text; beyond, a scrolling grid
SHOWN = {"node_rank": "node", "hostname": "host", "rank": "rank",
         "throughput": "samples/s", "data_wait_share": "data wait", "wait_per_step_s":
         "wait per step (ms)", "verdict": "verdict", **{k: k for k in LOADER_SETTINGS},
         "gpu_util": "GPU busy (DCGM)", "straggler": "straggler"}


def straggler_text(v: promread.JobView) -> str:
    """One sentence on the job's input straggler(s), with their nodes."""
    slow = v.stragglers()
    if v.ranks.empty:
        return "No rank of this job reports now."
    if slow.empty:
        return (f"No input straggler: no rank waits {STRAGGLER_RATIO:g}× the others' mean "
                f"per step and {STRAGGLER_MIN_S * 1000:g} ms more.")
    parts = []
    for r in slow.itertuples():
        others = v.others_wait_s.get(r.rank, math.nan)
        parts.append(f"rank {r.rank} on node {r.node_rank} ({r.hostname}) waits "
                     f"{r.wait_per_step_s * 1000:,.1f} ms a step for data against the other "
                     f"ranks' {others * 1000:,.1f} ms")
    nodes = sorted({(int(r.node_rank), str(r.hostname)) for r in slow.itertuples()
                    if r.node_rank == r.node_rank})
    where = ", ".join(f"node {n} ({h})" for n, h in nodes)
    return ("Input straggler: " + "; ".join(parts) + ". The whole job waits for its loader "
            f"in the all-reduce. Its loader is changed from the dashboard on {where} (its "
            "probe reads that node's store).")


def table(v: promread.JobView) -> pd.DataFrame:
    t = v.ranks.copy()
    t["wait_per_step_s"] = t["wait_per_step_s"] * 1000
    for col in ("data_wait_share", "gpu_util"):
        t[col] = t[col].map(lambda x: f"{x:.0%}" if isinstance(x, float) and x == x else "")
    return t[list(SHOWN)].rename(columns=SHOWN)


def render_job_tab(url: str) -> None:
    st.caption(f"The whole job, from Prometheus at `{url}` (every node's "
               f"`monitor run --metrics-port` scraped there); refreshed every {REFRESH_S:g} s."
               if "`" not in url else plain(f"The whole job, from Prometheus at {url}."))
    _job_fragment(url)
    st.subheader("Compare two jobs")
    _compare_fragment(url)


@st.fragment(run_every=REFRESH_S)
def _job_fragment(url: str) -> None:
    """The tab's body, re-run every REFRESH_S: a job that starts, and a node that joins,
    appear without a reload."""
    try:
        ids = promread.jobs(url)
        if not ids:
            st.info("Prometheus has no job with ranks yet: start each node's job under "
                    "`monitor run --metrics-port 9464 --metrics-address 0.0.0.0 -- torchrun "
                    "...` and add the nodes to Prometheus's scrape targets.")
            return
        pick = st.selectbox("job", ids, key="prom_job") if len(ids) > 1 else ids[0]
        v = promread.job(url, pick)
        hist = promread.wait_history(url, pick)
    except promread.PrometheusError as exc:
        st.warning(plain(str(exc)), icon="⚠️")
        return
    c = st.columns(3)
    c[0].metric("job throughput (samples/s)", f"{v.throughput:,.1f}")
    c[1].metric("ranks reporting", f"{len(v.ranks)}")
    c[2].metric("nodes", f"{v.ranks['node_rank'].nunique()}")
    (st.warning if not v.stragglers().empty else st.success)(plain(straggler_text(v)))
    shown = table(v)
    if len(shown) <= TABLE_MAX:
        st.table(shown.set_index("rank"))  # text in the page, every row
    else:
        st.dataframe(shown, hide_index=True, key="prom_ranks")
    steps = hist.rename(columns={"wait_per_step_s": "wait_s"})
    st.plotly_chart(charts.rank_wait_figure(steps), key="prom_rank_wait",
                    config={"displaylogo": False, "responsive": True})


def seen_label(j: promread.SeenJob, now: float | None = None) -> str:
    if j.live:
        return f"{j.job_id} (live)"
    ago = (time.time() if now is None else now) - j.last_ts
    when = f"{ago / 60:,.0f} min" if ago < 5400 else f"{ago / 3600:,.1f} h"
    return f"{j.job_id} (ended {when} ago)"


@st.fragment
def _compare_fragment(url: str) -> None:
    """Two jobs Prometheus held in the last day, side by side: each read at its own moment
    (a live one now, an ended one at its last scrape), so yesterday's settings compare with
    today's. Re-read when a pick changes (not every REFRESH_S: two jobs' queries)."""
    try:
        seen = promread.recent_jobs(url)
    except promread.PrometheusError as exc:
        st.warning(plain(str(exc)), icon="⚠️")
        return
    if len(seen) < 2:
        st.caption("Prometheus holds one job of the last day: a second job (another "
                   "setting, another day) can be compared with it here.")
        return
    by = {j.job_id: j for j in seen}
    ids = list(by)
    c = st.columns(2)
    a = c[0].selectbox("job", ids, index=1, format_func=lambda i: seen_label(by[i]),
                       key="prom_cmp_a")
    b = c[1].selectbox("against", ids, index=0, format_func=lambda i: seen_label(by[i]),
                       key="prom_cmp_b")
    if a == b:
        st.info("Pick two different jobs.")
        return
    try:
        cmp = promread.compare(url, by[a], by[b])
    except promread.PrometheusError as exc:
        st.warning(plain(str(exc)), icon="⚠️")
        return
    st.table(cmp.rows.set_index("figure"))
    st.caption(f"Rates over the last {promread.RANGE} of each job: now for a live job, up to "
               "its last scrape for one that ended. The change is from the first to the "
               "second.")
