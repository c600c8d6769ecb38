"""Training sessions with several ranks: real `torchrun --standalone` jobs (gloo, CPU) under
`monitor run`, one run per job with per-rank series, the input-straggler verdict, per-rank
loader requests, and nothing left behind however the job ends."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.store import Store
from tests import jobs
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
DDP = ROOT / "examples" / "train_ddp.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
pytestmark = pytest.mark.slow


def start(db: Path, nproc: int, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                             "--", TORCHRUN, "--standalone", f"--nproc-per-node={nproc}",
                             str(DDP), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen) -> tuple[int, dict | None, str, str]:
    out, err = p.communicate(timeout=240)
    last = [ln for ln in out.splitlines() if ln.startswith("{")]
    return p.returncode, (json.loads(last[-1]) if last else None), out, err


def test_a_slow_rank_is_named_an_input_straggler(tmp_path, no_leaks):
    """Two real ranks, rank 1 slow. One slow rank among many: 64 ranks read back in
    tests/test_job_page.py, the Prometheus rule at 1,024 in tests/test_rules_at_scale.py;
    four real ranks, two a node: below (a 4-rank copy of this job cost the suite 16 CPU-s
    for the rule this one checks)."""
    nproc = 2
    rc, d, out, err = finish(start(tmp_path / "s.db", nproc, "--epochs", "2",
                                   "--slow-rank", "1", "--slow-factor", "4"))
    assert rc == 0, err
    assert d["verdict"] == "input-straggler" and "rank 1 waits" in d["verdict_text"]
    assert "verdict: input-straggler" in err  # the summary people read
    assert d["world_size"] == nproc and [r["rank"] for r in d["ranks"]] == list(range(nproc))
    waits = {r["rank"]: r["wait_per_step_s"] for r in d["ranks"]}
    assert waits[1] == max(waits.values())
    first = d["advice"][0]
    assert first["reason"].startswith("rank 1:") and first["param"] == "num_workers"
    assert first["predicted_throughput"] > d["throughput"]
    store = Store(tmp_path / "s.db")
    assert len(store.runs()) == 1  # one job, one run
    assert sorted(store.steps(1)["rank"].unique()) == list(range(nproc))
    host = store.host_samples(0.0)
    per_rank = host[host["rank"].notna()]
    assert set(per_rank["rank"].astype(int)) == set(range(nproc))
    counted = per_rank["workers"].dropna()  # (a rank that has exited has no reading)
    assert len(counted) and (counted == 0).all()  # ranks are never counted as workers


@pytest.mark.xdist_group(jobs.GROUP)
def test_a_balanced_job_has_no_straggler(two_rank_job):
    """(The job's other outputs are read by test_cluster, test_trackers and test_wandb.)"""
    d, err = two_rank_job.summary, two_rank_job.err
    assert two_rank_job.returncode == 0 and d is not None, err[-3000:]
    assert d["verdict"] != "input-straggler" and d["world_size"] == 2
    assert d["throughput"] == pytest.approx(sum(r["throughput"] for r in d["ranks"]))


def test_a_request_for_one_rank_lands_at_its_next_epoch(tmp_path, no_leaks):
    db = tmp_path / "r.db"
    p = start(db, 2, "--epochs", "2", "--slow-rank", "1", "--slow-factor", "4")
    store = Store(db) if wait_for(db.exists, timeout=60) else None

    def both_ranks_in_epoch_0() -> bool:
        s = store.steps(1)
        return not s.empty and set(s["rank"]) == {0, 1} and s["epoch"].max() == 0
    assert wait_for(both_ranks_in_epoch_0, timeout=120)
    cid = store.request_control(1, "config", {"num_workers": 2, "rank": 1})
    rc, d, out, err = finish(p)
    assert rc == 0, err
    assert "rank 1/2 epoch 1" in out and "(num_workers=2)" in out.split("rank 1/2 epoch 1")[1]
    assert "rank 0/2 epoch 1" in out and "(num_workers=0)" in \
        out.split("rank 0/2 epoch 1")[1].splitlines()[0]
    assert store.control_result(cid)[1] == "ok: applied at epoch 1 (rank 1)"
    ranks = store.ranks(1).set_index("rank")["config"]
    assert ranks[1]["num_workers"] == 2 and ranks[0]["num_workers"] == 0
    steps = store.steps(1)
    assert set(steps[(steps["rank"] == 1) & (steps["epoch"] == 1)]["config_seq"]) == {1}
    assert set(steps[steps["rank"] == 0]["config_seq"]) == {0}


def test_a_rank_that_raises_fails_the_run_and_its_exit_code_passes(tmp_path, no_leaks):
    rc, d, _, err = finish(start(tmp_path / "f.db", 2, "--epochs", "3", "--fail-rank", "1"))
    assert rc == 1, err  # torchrun's own exit status for a failed worker
    assert "rank 1 failed on purpose" in err
    assert d["status"] == "failed" and "exit code 1" in d["error"]


def test_ctrl_c_of_monitor_run_stops_the_whole_job(tmp_path, no_leaks):
    db = tmp_path / "c.db"
    p = start(db, 2, "--epochs", "50")
    store = Store(db) if wait_for(db.exists, timeout=60) else None
    assert wait_for(lambda: len(store.steps(1)) >= 10, timeout=120)
    p.send_signal(signal.SIGINT)
    rc, _, _, err = finish(p)
    assert rc != 0, err  # as torchrun gives it
    assert store.run(1)["status"] == "stopped"


def test_a_store_holding_only_rank_1_keeps_its_settings_and_the_jobs_world_size(tmp_path,
                                                                               no_leaks):
    """One `monitor run` per node (torchrun --nnodes=2 on one host, two ranks each), each
    node shaped as a Kubeflow PyTorchJob pod: the pod's own RANK and WORLD_SIZE count pods
    (0 or 1 of 2), and torchrun inside it starts the processes. The ranks are torchrun's
    (0-3 of 4), never the pod's; the store of node 1 holds ranks 2 and 3, whose probes do
    not speak for the run as rank 0's does; its run still carries the loader settings, and
    its JSON the job's world size and the ranks it holds."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / f"n{node}.db"),
         "--json", "--", TORCHRUN, "--nnodes=2", "--nproc-per-node=2", f"--node-rank={node}",
         "--master-addr=127.0.0.1", f"--master-port={port}", str(DDP), "--epochs", "2",
         "--samples", "256", "--num-workers", "1", "--batch-size", "16"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(node), "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # the pod's
        for node in (0, 1)]
    results = [finish(p) for p in procs]
    for rc, d, _out, err in results:
        assert rc == 0 and d is not None, err[-3000:]
    d1 = results[1][1]
    assert d1["ranks_held"] == [2, 3] and d1["world_size"] == 4, d1
    assert d1["config"]["batch_size"] == 16 and d1["config"]["num_workers"] == 1, d1["config"]
    assert results[0][1]["ranks_held"] == [0, 1] and results[0][1]["world_size"] == 4
    run1 = Store(tmp_path / "n1.db").run(d1["run_id"])
    assert run1["config"]["num_workers"] == 1 and run1["config"]["pin_memory"] is not None
    ranks = Store(tmp_path / "n1.db").ranks(d1["run_id"])
    assert ranks[["rank", "local_rank", "node_rank"]].values.tolist() == [[2, 0, 1], [3, 1, 1]]


SRUN = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "8"}


@pytest.mark.parametrize(("env", "want", "node", "nodes"), [
    # srun python train.py: Slurm started every rank, no torchrun
    (SRUN, (5, 1, 8), 1, 2),
    # torchrun under srun (one task a node): torchrun's variables win
    ({**SRUN, "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "RANK": "6",
      "LOCAL_RANK": "2", "WORLD_SIZE": "8", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"},
     (6, 2, 8), 1, 2),
    # a batch script's own step (python train.py, no srun): one process, not rank 0 of 8
    ({"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8", "SLURM_PROCID": "0", "SLURM_NODEID": "0",
      "SLURM_STEP_NUM_TASKS": "1"}, (0, None, 1), 0, None),
    # a Kubeflow PyTorchJob pod running torchrun: the pod's RANK/WORLD_SIZE are replaced by
    # torchrun's in the process (what the process sees is torchrun's)
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
      "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job"},
     (3, 1, 4), 1, 2),
])
def test_placement_from_each_launcher(env, want, node, nodes):
    """rank, local rank and world size, and the node and node count, as each launcher
    leaves them in the training process's environment."""
    from monitor.probe.identity import node_count, node_rank, rank_identity

    assert rank_identity(env, dist=False) == want
    assert node_rank(env) == node and node_count(env) == nodes


def test_a_slurm_shaped_launch_without_torchrun(tmp_path, no_leaks):
    """Two tasks as `srun --ntasks 2 --nodes 2 --cpus-per-task 1` starts them (the SLURM_*
    variables, no torchrun: the script joins the gloo group from SLURM_PROCID and
    SLURM_NTASKS), each under its own `monitor run`: ranks 0 and 1 of a world of 2, on nodes
    0 and 1, the job id from SLURM_JOB_ID and the CPU budget from SLURM_CPUS_PER_TASK."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in
            ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "monitor", "run", "--db", str(tmp_path / f"n{task}.db"),
         "--json", "--", sys.executable, str(DDP), "--epochs", "2", "--samples", "256",
         "--num-workers", "1", "--batch-size", "16"], cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
             "SLURM_PROCID": str(task), "SLURM_LOCALID": "0", "SLURM_NODEID": str(task),
             "SLURM_CPUS_PER_TASK": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for task in (0, 1)]
    results = [finish(p) for p in procs]
    for task, (rc, d, _out, err) in enumerate(results):
        assert rc == 0 and d is not None, err[-3000:]
        assert d["ranks_held"] == [task] and d["world_size"] == 2, d
        assert d["evidence"]["usable_cores"] == 1, d["evidence"]
        ranks = Store(tmp_path / f"n{task}.db").ranks(d["run_id"])
        assert ranks["job_id"].tolist() == ["4242"] and ranks["node_rank"].tolist() == [task]
        assert ranks["placement"][0].get("hpc_job") == "4242"  # dcgm-exporter's Slurm label
