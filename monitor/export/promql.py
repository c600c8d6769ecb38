"""Every PromQL expression the project ships, in one place: the Grafana dashboard's panels
(deploy/grafana/starvation-monitor.json) and the Prometheus recording and alerting rules
(deploy/prometheus/rules.yml) are written from here, and a test checks that the files on disk
are what this module writes and runs every panel against a real Prometheus.

    python -m monitor.export.promql --write deploy     # after changing an expression

The input straggler across hosts: each node's exporter sees only its own ranks, so the job
is put together in PromQL. A rank's wait per step W is rate(data wait) / rate(steps); the
other ranks' mean is (Σ_job W - W) / (n_job - 1); a rank straggles when W >= STRAGGLER_RATIO
x that mean and W - mean >= STRAGGLER_MIN_S, the page's rule (diagnosis/straggler.py) with
the others' mean for their median (PromQL has no median of "all but this one"): the same for
two ranks, and close while one rank stands out.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from monitor.config import LOADER_SETTINGS
from monitor.thresholds import KPI_WINDOW_S, STRAGGLER_MIN_S, STRAGGLER_RATIO

RANK = "job_id, node_rank, rank, hostname"  # what names a rank across nodes
SEL = 'job_id=~"$job_id", hostname=~"$hostname", run_id=~"$run_id"'
DS = {"type": "prometheus", "uid": "${datasource}"}
RULES_RANGE = "1m"


def per_rank(counter: str, sel: str, rng: str) -> str:
    return f"sum by ({RANK}) (rate(starvation_{counter}{{{sel}}}[{rng}]))"


def _seconds(rng: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    unit = next(u for u in ("ms", "s", "m", "h") if rng.endswith(u))
    return float(rng[:-len(unit)]) * units[unit]


def throughput(sel: str, rng: str) -> str:
    """Each rank's samples per second over the range. rate() divides by the whole range, so
    a rank younger than the range (a node that just joined) would read low by its missing
    part: such a rank is its samples over its own age at its last scrape instead, from the
    counter's `_created` (the rank's first step, monitor/export/prometheus.py), at least a
    second. A series without `_created` reads as rate() alone."""
    x, created = f"starvation_samples_total{{{sel}}}", f"starvation_samples_created{{{sel}}}"
    return (f"sum by ({RANK}) ((rate({x}[{rng}]) unless (time() - {created}) < "
            f"{_seconds(rng):g}) or {x} / clamp_min(timestamp({x}) - {created}, 1))")


def wait_per_step(sel: str, rng: str) -> str:
    """W: each rank's data wait per step over the range."""
    return f"({per_rank('data_wait_seconds_total', sel, rng)} / " \
           f"{per_rank('steps_total', sel, rng)})"


def others_mean(w: str) -> str:
    """The mean of the other ranks' W, per rank (NaN or +Inf for a rank alone)."""
    # an explicit empty label list: `group_right (` would read the next term as labels
    return (f"((sum by (job_id) ({w}) - on (job_id) group_right () {w}) / on (job_id) "
            f"group_left () (count by (job_id) ({w}) - 1))")


def straggler(w: str, others: str) -> str:
    """The ranks that straggle, valued by their wait per step."""
    return f"({w} >= {STRAGGLER_RATIO:g} * {others}) and ({w} - {others} >= {STRAGGLER_MIN_S:g})"


def finite(w: str) -> str:
    """The ranks whose W is a number: a rank with no step in the range (hung, or just
    started) reads 0/0 or x/0, which would make every other rank's mean NaN or +Inf and hide
    the job's stragglers."""
    return f"({w} >= 0 < Inf)"


def missing(window: str = "10m") -> str:
    """Ranks seen in the last `window` whose series have stopped (their node's exporter
    went, or stopped exposing them) while other ranks of their job still report."""
    seen = f'group by ({RANK}) (max_over_time(starvation_steps_total{{job_id!=""}}[{window}]))'
    now = f'group by ({RANK}) (starvation_steps_total{{job_id!=""}})'
    return f"({seen} unless on ({RANK}) {now}) and on (job_id) group by (job_id) ({now})"


def job_sel(sel: str) -> str:
    return f'job_id!="", {sel}' if sel else 'job_id!=""'


# -- the dashboard ------------------------------------------------------------------------
def _target(expr: str, legend: str = "", ref: str = "A", table: bool = False) -> dict:
    t: dict[str, Any] = {"refId": ref, "expr": expr, "datasource": DS}
    if legend:
        t["legendFormat"] = legend
    if table:
        t.update(instant=True, format="table")
    return t


def _panel(pid: int, kind: str, title: str, pos: tuple[int, int, int, int], targets: list,
           unit: str | None = None, description: str = "") -> dict:
    x, y, w, h = pos
    p: dict[str, Any] = {"id": pid, "type": kind, "title": title, "description": description,
                         "gridPos": {"x": x, "y": y, "w": w, "h": h}, "datasource": DS,
                         "targets": targets}
    if kind == "timeseries":
        p["fieldConfig"] = {"defaults": {"unit": unit or "short", "min": 0}, "overrides": []}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}}
    return p


RANK_LEGEND = "job {{job_id}} · node {{node_rank}} · rank {{rank}}"


def panels(rng: str = "$__rate_interval") -> list[dict]:
    w = wait_per_step(SEL, rng)
    jw = wait_per_step(job_sel(SEL), rng)
    return [
        _panel(1, "timeseries", "Job throughput (samples/s), and per rank", (0, 0, 12, 8), [
            _target(f"sum by (job_id) (rate(starvation_samples_total{{{SEL}}}[{rng}]))",
                    "job {{job_id}} (all nodes)"),
            _target(per_rank("samples_total", SEL, rng), RANK_LEGEND, "B")], "short",
            "Σ over every node's exporter: the job's throughput; below it each rank's."),
        _panel(2, "timeseries", "Data-wait share per rank", (12, 0, 12, 8), [
            _target(f"{per_rank('data_wait_seconds_total', SEL, rng)} / "
                    f"{per_rank('step_seconds_total', SEL, rng)}", RANK_LEGEND)],
            "percentunit", "Share of each rank's step time spent waiting for its loader."),
        _panel(3, "timeseries", "Data wait per step, per rank (the straggler signal)",
               (0, 8, 12, 8), [_target(w, RANK_LEGEND)], "s",
               "A rank far above the others is an input straggler: it waits for data while "
               "the others wait for it in the all-reduce."),
        _panel(4, "table", "Input stragglers (across every node)", (12, 8, 12, 8), [
            _target(straggler(finite(jw), others_mean(finite(jw))), table=True)], None,
            f"Ranks whose wait per step is at least {STRAGGLER_RATIO:g}x the other ranks' "
            f"mean and {STRAGGLER_MIN_S * 1000:g} ms more; the value is its wait per step."),
        _panel(5, "timeseries", "Device busy (the sawtooth), per rank", (0, 16, 12, 8), [
            _target(f"starvation_device_busy_ratio{{{SEL}}}", RANK_LEGEND)], "percentunit",
            f"Step-derived device busy over each rank's last {KPI_WINDOW_S:g} s."),
        _panel(6, "timeseries", "GPU utilization of each rank's GPU (DCGM)", (12, 16, 12, 8), [
            _target(gpu_util(SEL), RANK_LEGEND + " · GPU {{gpu}}")],
            "percent", "dcgm-exporter's utilization joined to our ranks on the GPU's UUID (the "
            "one label both carry unchanged in containers, where DCGM's Hostname is its pod)."),
        _panel(7, "timeseries", "Workers: CPU (cores)", (0, 24, 12, 8), [
            _target(f"starvation_workers_cpu_cores{{{SEL}}}", "workers · " + RANK_LEGEND),
            _target(f"starvation_main_process_cpu_cores{{{SEL}}}", "main · " + RANK_LEGEND,
                    "B")], "short"),
        _panel(8, "table", "Ranks seen of the job's world size", (12, 24, 12, 8), [
            _target(f"count by (job_id, world_size) (starvation_run_info{{{SEL}}})",
                    table=True)], None,
            "How many ranks report, against world_size: each node's exporter shows its own."),
        _panel(9, "table", f"Verdict per rank (last {KPI_WINDOW_S:g} s)", (0, 32, 12, 6), [
            _target(f"starvation_verdict{{{SEL}}} == 1", table=True)]),
        _panel(10, "table", "Loader settings in force", (12, 32, 12, 6), [
            _target(f"starvation_loader_info{{{SEL}}}", table=True)]),
    ]


def _variable(name: str, query: str) -> dict:
    return {"name": name, "type": "query", "datasource": DS, "query": query,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}}


def gpu_util(sel: str) -> str:
    """dcgm-exporter's utilization (percent) of each rank's GPU, labelled with the rank's
    job, node, rank and host: joined on the GPU's UUID, the one label both carry unchanged in
    containers (DCGM's own Hostname there is its pod's)."""
    return ("DCGM_FI_DEV_GPU_UTIL * on (UUID) group_left (job_id, node_rank, rank, hostname) "
            "max by (UUID, job_id, node_rank, rank, hostname) "
            f'(starvation_run_info{{{sel}, UUID!=""}})')


def dashboard() -> dict:
    return {
        "title": "Starvation Monitor", "uid": "starvation-monitor", "schemaVersion": 39,
        "version": 2, "tags": ["pytorch", "dataloader", "gpu"],
        "time": {"from": "now-30m", "to": "now"}, "refresh": "10s", "editable": True,
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Prometheus"},
            _variable("job_id", "label_values(starvation_run_info, job_id)"),
            _variable("hostname", 'label_values(starvation_run_info{job_id=~"$job_id"}, '
                                  "hostname)"),
            _variable("run_id", 'label_values(starvation_run_info{job_id=~"$job_id", '
                                'hostname=~"$hostname"}, run_id)'),
        ]},
        "annotations": {"list": [{
            "name": "Loader settings", "enable": True, "iconColor": "orange", "datasource": DS,
            "expr": f"starvation_loader_info{{{SEL}}} unless starvation_loader_info{{{SEL}}} "
                    "offset 1m",
            "step": "30s", "titleFormat": "loader settings · " + RANK_LEGEND,
            "textFormat": " ".join(f"{k}={{{{{k}}}}}" for k in LOADER_SETTINGS),
            "useValueForTime": False}]},
        "panels": panels(),
    }


# -- the rules ------------------------------------------------------------------------------
def rules(rng: str = RULES_RANGE) -> str:
    """deploy/prometheus/rules.yml: recording rules per rank and job, and the alerts."""
    w = f"starvation:wait_per_step_seconds:rate{rng}"
    o = f"starvation:others_wait_per_step_seconds:rate{rng}"
    rec = [
        (f"starvation:data_wait_share:rate{rng}",
         f"{per_rank('data_wait_seconds_total', '', rng)} / "
         f"{per_rank('step_seconds_total', '', rng)}"),
        (w, wait_per_step("", rng)),
        (f"starvation:samples:rate{rng}", per_rank("samples_total", "", rng)),
        (f"starvation:job_samples:rate{rng}",
         f"sum by (job_id) (rate(starvation_samples_total[{rng}]))"),
        (o, others_mean(finite(f'{w}{{job_id!=""}}'))),
        ("starvation:input_straggler", straggler(finite(f'{w}{{job_id!=""}}'), o)),
        ("starvation:job_ranks_reporting",
         f'count by (job_id) (group by ({RANK}) (starvation_steps_total{{job_id!=""}}))'),
        ("starvation:rank_missing", missing()),
    ]
    lines = ["# Prometheus rules for Starvation Monitor, written by",
             "#   python -m monitor.export.promql --write deploy",
             "# (monitor/export/promql.py; thresholds from monitor/thresholds.py). Load it with",
             "# `rule_files: [rules.yml]` in prometheus.yml.",
             "groups:", "  - name: starvation-monitor", "    rules:"]
    for name, expr in rec:
        lines += [f"      - record: {name}", f"        expr: {json.dumps(expr)}"]
    lines += [
        "      - alert: InputStraggler",
        "        expr: starvation:input_straggler",
        "        for: 2m",
        "        labels: {severity: warning}",
        "        annotations:",
        "          summary: " + json.dumps(
            "rank {{ $labels.rank }} (node {{ $labels.node_rank }}) of job "
            "{{ $labels.job_id }} waits {{ $value | humanizeDuration }} per step for data"),
        "          description: " + json.dumps(
            f"Its wait per step is at least {STRAGGLER_RATIO:g}x the other ranks' and "
            f"{STRAGGLER_MIN_S * 1000:g} ms more: the whole job waits for its loader in the "
            "all-reduce. Give that rank's loader more workers, or find its slow storage."),
        "      - alert: RankMissing",
        "        expr: starvation:rank_missing",
        "        for: 2m",
        "        labels: {severity: warning}",
        "        annotations:",
        "          summary: " + json.dumps(
            "rank {{ $labels.rank }} (node {{ $labels.node_rank }}, {{ $labels.hostname }}) "
            "of job {{ $labels.job_id }} stopped reporting"),
        "      - alert: InputStarved",
        f"        expr: starvation:data_wait_share:rate{rng} > 0.5",
        "        for: 10m",
        "        labels: {severity: info}",
        "        annotations:",
        "          summary: " + json.dumps(
            "rank {{ $labels.rank }} of job {{ $labels.job_id }} waits for data "
            "{{ $value | humanizePercentage }} of its step time"),
    ]
    return "\n".join(lines) + "\n"


def files() -> dict[str, str]:
    """What --write writes, by path under deploy/."""
    return {"grafana/starvation-monitor.json": json.dumps(dashboard(), indent=1,
                                                          ensure_ascii=False) + "\n",
            "prometheus/rules.yml": rules()}


def main() -> None:
    ap = argparse.ArgumentParser(description="write the dashboard and the rules")
    ap.add_argument("--write", metavar="DEPLOY", required=True)
    a = ap.parse_args()
    for rel, text in files().items():
        path = Path(a.write) / rel
        path.write_text(text, encoding="utf-8")
        print(path)


if __name__ == "__main__":
    main()
