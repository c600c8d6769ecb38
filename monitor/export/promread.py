"""A job across nodes read back from Prometheus (the page's `--prometheus URL` mode): each
node's exporter exposes its own ranks; Prometheus holds them all, and this module asks its
HTTP API (`/api/v1/query`) for the job's rank table, the straggler and the per-rank wait.

The expressions are monitor/export/promql.py's (one home for PromQL); the verdict of each
rank is the one its node's exporter computed with the page's own code and hysteresis
(`starvation_verdict`), not a second diagnosis made here. Nothing is written: a loader change
for a rank is requested on that rank's own node, whose store its probe reads.
"""
from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from monitor.config import LOADER_SETTINGS
from monitor.export import promql

RANGE = "30s"  # the rates' range: a few scrapes at any usual interval (15 s at most)
TIMEOUT_S = 3.0
LOADER_KEYS = LOADER_SETTINGS  # the labels of starvation_loader_info
COLUMNS = ("node_rank", "hostname", "rank", "throughput", "data_wait_share",
           "wait_per_step_s", "verdict", *LOADER_KEYS, "gpu_util", "straggler")


class PrometheusError(RuntimeError):
    """Prometheus could not be read; the message says what to check."""


@dataclass(frozen=True)
class JobView:
    job_id: str
    ranks: pd.DataFrame  # COLUMNS, one row per rank, by node then rank
    throughput: float  # the job's samples/s, Σ over every node
    others_wait_s: dict[int, float]  # rank -> the other ranks' mean wait per step

    def stragglers(self) -> pd.DataFrame:
        return self.ranks[self.ranks["straggler"]]


def _get(url: str, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
    """One call of Prometheus's HTTP API (`path` under /api/v1): its `data.result`."""
    full = url.rstrip("/") + f"/api/v1/{path}?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise PrometheusError(f"Prometheus at {url} refused a query ({exc.code}): "
                              f"{_error_of(exc)}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise PrometheusError(f"cannot read Prometheus at {url} ({why}): check that it runs "
                              "and that --prometheus names its base URL, e.g. "
                              "http://127.0.0.1:9090") from None
    if body.get("status") != "success":
        raise PrometheusError(f"Prometheus at {url}: {body.get('error', 'no result')}")
    return body["data"]["result"]


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's result (Prometheus's JSON `data.result`)."""
    return _get(url, "query", {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})})


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("error"))
    except (ValueError, OSError):
        return exc.reason or "no reason given"


def jobs(url: str) -> list[str]:
    """The job ids with ranks reporting now, the most ranks first."""
    res = query(url, 'count by (job_id) (starvation_run_info{job_id!=""})')
    return [s["metric"]["job_id"] for s in sorted(res, key=lambda s: -float(s["value"][1]))]


def _value(s: dict[str, Any]) -> float:
    try:
        return float(s["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


def _key(m: dict[str, str]) -> tuple[str, str, str]:
    return m.get("node_rank", ""), m.get("hostname", ""), m.get("rank", "")


def _int(v: str) -> int | float:
    try:
        return int(v)
    except (TypeError, ValueError):
        return math.nan


def job(url: str, job_id: str, rng: str = RANGE, at: float | None = None) -> JobView:
    """The job's ranks as every node's exporter reports them, the straggler named by the
    rule the rules file and the Grafana panel use; every query at one moment (`at`, else
    now)."""
    at = time.time() if at is None else at
    sel = f'job_id="{_quote(job_id)}"'
    w = promql.wait_per_step(sel, rng)
    figures = {
        "throughput": promql.throughput(sel, rng),
        "data_wait_share": f"{promql.per_rank('data_wait_seconds_total', sel, rng)} / "
                           f"{promql.per_rank('step_seconds_total', sel, rng)}",
        "wait_per_step_s": w,
    }
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}

    def row(m: dict[str, str]) -> dict[str, Any]:
        k = _key(m)
        return rows.setdefault(k, {"node_rank": _int(k[0]), "hostname": k[1],
                                   "rank": _int(k[2]), "straggler": False})
    for name, expr in figures.items():
        for s in query(url, expr, at):
            row(s["metric"])[name] = _value(s)
    for s in query(url, f"starvation_verdict{{{sel}}} == 1", at):
        row(s["metric"])["verdict"] = s["metric"].get("starvation_verdict")
    for s in query(url, f"starvation_loader_info{{{sel}}}", at):
        r = row(s["metric"])
        for k in LOADER_KEYS:
            r[k] = s["metric"].get(k)
    for s in query(url, promql.gpu_util(sel), at):  # where dcgm-exporter is scraped too
        r = row(s["metric"])  # (a rank of several GPUs: its busiest)
        r["gpu_util"] = max(r.get("gpu_util") or 0.0, _value(s) / 100)
    fw = promql.finite(w)
    others = {}
    for s in query(url, promql.others_mean(fw), at):
        others[_int(s["metric"].get("rank", ""))] = _value(s)
    for s in query(url, promql.straggler(fw, promql.others_mean(fw)), at):
        row(s["metric"])["straggler"] = True
    total = query(url, f"sum({promql.throughput(sel, rng)})", at)
    frame = pd.DataFrame(list(rows.values()), columns=list(COLUMNS))
    frame = frame.sort_values(["node_rank", "rank"], kind="stable").reset_index(drop=True)
    frame["straggler"] = frame["straggler"].fillna(False).astype(bool)
    return JobView(job_id, frame, _value(total[0]) if total else 0.0, others)


def wait_history(url: str, job_id: str, minutes: float = 5.0, step_s: float = 2.0,
                 rng: str = RANGE, end: float | None = None) -> pd.DataFrame:
    """Each rank's wait per step over the last minutes (`/api/v1/query_range`): columns ts,
    node_rank, rank, wait_per_step_s."""
    end = time.time() if end is None else end
    expr = promql.wait_per_step(f'job_id="{_quote(job_id)}"', rng)
    res = _get(url, "query_range", {"query": expr, "start": f"{end - minutes * 60:.3f}",
                                    "end": f"{end:.3f}", "step": f"{step_s:g}"})
    out = [(float(t), _int(s["metric"].get("node_rank", "")), _int(s["metric"].get("rank", "")),
            float(v)) for s in res for t, v in s["values"]]
    return pd.DataFrame(out, columns=["ts", "node_rank", "rank", "wait_per_step_s"])


def _quote(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class SeenJob:
    job_id: str
    last_ts: float  # the last moment Prometheus held its series, to within `within_s`
    live: bool  # its ranks report now
    within_s: float = 0.0  # how far past its last scrape last_ts may be (0: exact)


def recent_jobs(url: str, within_s: float = 86400.0, step_s: float = 15.0,
                now: float | None = None) -> list[SeenJob]:
    """Every job whose ranks reported in the last `within_s`, the last seen first: one
    range query, whatever the number of jobs. An ended job's last_ts is the `step_s` grid's
    (up to step_s past its last scrape: good for a label); last_moment() refines the one
    that is read."""
    now = time.time() if now is None else now
    res = _get(url, "query_range", {
        # over each step's own range: a job that lived between two steps is still seen
        "query": f'count by (job_id) (last_over_time(starvation_steps_total{{job_id!=""}}'
                 f'[{step_s:g}s]))',
        "start": f"{now - within_s:.3f}", "end": f"{now:.3f}", "step": f"{step_s:g}"})
    live = set(jobs(url))
    seen = []
    for s in res:
        if s.get("values"):
            jid = s["metric"]["job_id"]
            seen.append(SeenJob(jid, float(s["values"][-1][0]), jid in live,
                                0.0 if jid in live else step_s))
    return sorted(seen, key=lambda j: (not j.live, -j.last_ts))


def last_moment(url: str, j: SeenJob) -> SeenJob:
    """An ended job's last moment to the second (its series' last scrape), from the
    `within_s` before the moment recent_jobs saw; a live or exact one as it is."""
    if j.live or not j.within_s:
        return j
    res = _get(url, "query_range", {
        "query": f'count(starvation_steps_total{{job_id="{_quote(j.job_id)}"}})',
        "start": f"{j.last_ts - j.within_s:.3f}", "end": f"{j.last_ts:.3f}", "step": "1"})
    last = max((float(t) for s in res for t, _ in s.get("values") or []), default=j.last_ts)
    return replace(j, last_ts=last, within_s=0.0)


COMPARED = ("throughput", "ranks", "nodes", "data_wait_share", "wait_per_step_s",
            "stragglers", "verdicts", *LOADER_KEYS)


def _spread(values: pd.Series) -> str:
    """A loader setting over a job's ranks: its value, or the values where ranks differ."""
    vals = sorted({str(v) for v in values.dropna()})
    return vals[0] if len(vals) == 1 else (" / ".join(vals) + " (ranks differ)" if vals
                                           else "")


def job_figures(v: JobView) -> dict[str, Any]:
    """One job's figures for a comparison (COMPARED): the job's throughput, its ranks and
    nodes, the mean data-wait share and the worst wait per step over its ranks (with the
    rank), the input stragglers, the verdicts counted, each loader setting."""
    r = v.ranks
    worst = r.loc[r["wait_per_step_s"].idxmax()] if r["wait_per_step_s"].notna().any() \
        else None
    counts = r["verdict"].dropna().value_counts()
    out: dict[str, Any] = {
        "throughput": v.throughput, "ranks": len(r), "nodes": int(r["node_rank"].nunique()),
        "data_wait_share": float(r["data_wait_share"].mean()) if len(r) else math.nan,
        "wait_per_step_s": float(worst["wait_per_step_s"]) if worst is not None else math.nan,
        "worst_rank": int(worst["rank"]) if worst is not None and worst["rank"] == worst["rank"]
        else None,
        "stragglers": [int(x) for x in v.stragglers()["rank"]],
        "verdicts": ", ".join(f"{k} ×{n}" for k, n in counts.items()),
    }
    out.update({k: _spread(r[k]) for k in LOADER_KEYS})
    return out


LABELS = {"throughput": "samples/s (whole job)", "ranks": "ranks", "nodes": "nodes",
          "data_wait_share": "data wait (mean over ranks)",
          "wait_per_step_s": "worst wait per step", "stragglers": "input stragglers",
          "verdicts": "verdicts", **{k: k for k in LOADER_KEYS}}


def _shown(f: dict[str, Any], k: str) -> str:
    v = f[k]
    if k == "throughput":  # NaN: Prometheus had no rate for it (a job seen in one scrape)
        return f"{v:,.1f}" if v == v else ""
    if k == "data_wait_share":
        return f"{v:.0%}" if v == v else ""
    if k == "wait_per_step_s":
        return f"{v * 1000:,.1f} ms (rank {f['worst_rank']})" if v == v else ""
    if k == "stragglers":
        return ", ".join(f"rank {r}" for r in v) or "none"
    return str(v)


@dataclass(frozen=True)
class JobCompare:
    a: dict[str, Any]  # job_figures of each job
    b: dict[str, Any]
    rows: pd.DataFrame  # figure, the two jobs' values as text, the change


def compare(url: str, a: SeenJob, b: SeenJob, rng: str = RANGE) -> JobCompare:
    """Two jobs side by side, each read at its own moment (now if live, else its last
    scrape): COMPARED, the change from the first to the second (a percentage for rates and
    waits, a count for ranks and nodes, else same or changed)."""
    a, b = last_moment(url, a), last_moment(url, b)
    fa, fb = (job_figures(job(url, j.job_id, rng, None if j.live else j.last_ts))
              for j in (a, b))
    rows = []
    for k in COMPARED:
        x, y = fa[k], fb[k]
        if k in ("throughput", "data_wait_share", "wait_per_step_s"):
            change = f"{(y / x - 1) * 100:+.0f}%" if x and x == x and y == y else ""
        elif k in ("ranks", "nodes"):
            change = f"{y - x:+d}" if y != x else "same"
        else:
            change = "same" if x == y else "changed"
        rows.append({"figure": LABELS[k], a.job_id: _shown(fa, k), b.job_id: _shown(fb, k),
                     "change": change})
    return JobCompare(fa, fb, pd.DataFrame(rows))
