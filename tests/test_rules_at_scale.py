"""The shipped Prometheus rules (deploy/prometheus/rules.yml) at a job's scale, by Debian's
`promtool test rules`: synthetic counters for 4, 64 and 1,024 ranks over 2 to 128 nodes, one
or three slow ranks, a rank whose series stop, a rank that hangs (no step in the range) and
two jobs side by side. The straggler rule names exactly the slow ranks, the job's throughput
is the sum of its ranks', a stopped rank is reported missing and named by no other rule.

(Three slow ranks among four are not stragglers: the others' mean is then the slow ones', so
the three-slow cases start at 64 ranks.)"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from tests.conftest import ROOT, require

PROMTOOL = shutil.which("promtool")
STEP_S = 15  # the scrape interval of the synthetic series
STEPS = 10  # steps per scrape interval, every rank
SAMPLES = 48  # samples per step: 32 samples/s a rank
FAST_WAIT, SLOW_WAIT = 0.001, 0.1  # data wait per step (s)
EVAL = "8m"  # after the stopped rank's series end (5 min) and 2 min of alerts' `for`


@dataclass(frozen=True)
class Job:
    name: str
    ranks: int
    nodes: int
    slow: tuple[int, ...]
    stopped: tuple[int, ...] = ()
    hung: tuple[int, ...] = ()

    def labels(self, rank: int) -> dict[str, str]:
        per = self.ranks // self.nodes
        return {"hostname": f"{self.name}-node{rank // per}", "job_id": self.name,
                "node_rank": str(rank // per), "rank": str(rank)}

    def alive(self) -> list[int]:
        return [r for r in range(self.ranks) if r not in self.stopped]


def _sel(name: str, labels: dict[str, str], **extra: str) -> str:
    both = {**labels, **extra}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(both.items())) + "}"


def _series(job: Job) -> list[dict]:
    out = []
    for r in range(job.ranks):
        lab = {**job.labels(r), "local_rank": str(r % (job.ranks // job.nodes)),
               "run_id": str(r + 1)}
        steps = 0 if r in job.hung else STEPS
        wait = (SLOW_WAIT if r in job.slow else FAST_WAIT) * STEPS
        values = {"steps_total": steps, "samples_total": steps * SAMPLES,
                  "data_wait_seconds_total": wait, "step_seconds_total": 0.05 * STEPS}
        for name, inc in values.items():
            # a stopped rank: 20 scrapes (5 min), then a stale marker, as when its node's
            # exporter goes or stops exposing it
            tail = f"0+{inc}x20 stale" if r in job.stopped else f"0+{inc}x40"
            out.append({"series": _sel(f"starvation_{name}", lab), "values": tail})
    return out


def _expect(name: str, samples: list[tuple[dict[str, str], float]], scale: int = 1) -> dict:
    """`name` at EVAL, x scale and rounded (promtool compares floats exactly; a rate's
    extrapolation leaves the last bits to chance), against the samples' values."""
    expr = f"round({name} * {scale})"  # a function drops the metric's name
    return {"expr": expr, "eval_time": EVAL,
            "exp_samples": [{"labels": _sel("", lab), "value": round(v * scale)}
                            for lab, v in samples]}


def case(jobs: list[Job]) -> dict:
    """One promtool test: every job's series, and what each rule must give for them."""
    slow = [(j.labels(r), SLOW_WAIT) for j in jobs for r in j.slow]
    rate = STEPS * SAMPLES / STEP_S
    through = [({"job_id": j.name}, rate * len([r for r in j.alive() if r not in j.hung]))
               for j in jobs]
    reporting = [({"job_id": j.name}, float(len(j.alive()))) for j in jobs]
    gone = [(j.labels(r), 1.0) for j in jobs for r in j.stopped]
    alerts = [{"exp_labels": {**j.labels(r), "severity": "warning"},
               "exp_annotations": {"summary": f"rank {r} (node {j.labels(r)['node_rank']}, "
                                              f"{j.labels(r)['hostname']}) of job {j.name} "
                                              "stopped reporting"}}
              for j in jobs for r in j.stopped]
    return {"interval": f"{STEP_S}s",
            "input_series": [s for j in jobs for s in _series(j)],
            "promql_expr_test": [_expect("starvation:input_straggler", slow, 1000),
                                 _expect("starvation:job_samples:rate1m", through),
                                 _expect("starvation:job_ranks_reporting", reporting),
                                 _expect("starvation:rank_missing", gone)],
            "alert_rule_test": [{"eval_time": EVAL, "alertname": "RankMissing",
                                 "exp_alerts": alerts}]}


CASES = {
    "4 ranks, 2 nodes, one slow; a second job beside it": [
        Job("a", 4, 2, slow=(3,)), Job("b", 4, 2, slow=(0,))],
    "64 ranks, 8 nodes, three slow, one stopped, one hung": [
        Job("a", 64, 8, slow=(5, 17, 63), stopped=(40,), hung=(22,))],
    "1,024 ranks, 128 nodes, one slow, one stopped; a second job beside it": [
        Job("a", 1024, 128, slow=(777,), stopped=(3,)), Job("b", 16, 2, slow=())],
    "1,024 ranks, 128 nodes, three slow, one hung": [
        Job("a", 1024, 128, slow=(0, 511, 1023), hung=(100,))],
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_rules_name_exactly_the_slow_ranks_at_scale(tmp_path, name):
    spec = {"rule_files": [str(ROOT / "deploy" / "prometheus" / "rules.yml")],
            "evaluation_interval": f"{STEP_S}s", "tests": [case(CASES[name])]}
    path = tmp_path / "cases.yml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    promtool = require(PROMTOOL, "prometheus")
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def test_a_wrong_expectation_fails_promtool(tmp_path):
    """The check can fail: a fast rank expected as a straggler is refused."""
    jobs = [Job("a", 4, 2, slow=(3,))]
    test = case(jobs)
    test["promql_expr_test"][0]["exp_samples"].append(
        {"labels": _sel("", jobs[0].labels(1)), "value": round(SLOW_WAIT * 1000)})
    spec = {"rule_files": [str(ROOT / "deploy" / "prometheus" / "rules.yml")],
            "evaluation_interval": f"{STEP_S}s", "tests": [test]}
    path = tmp_path / "cases.yml"
    path.write_text(json.dumps(spec))
    promtool = require(PROMTOOL, "prometheus")
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "starvation:input_straggler" in r.stdout + r.stderr
