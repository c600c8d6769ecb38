"""What the usable CPUs do together (NOTE [the CPUs' capacity] in
monitor/sampling/capacity.py): read from a /sys topology, kept from a measurement, and used
by the bound model in units of one task alone."""
from __future__ import annotations

import json

import pytest

from monitor.diagnosis import fit_bound
from monitor.diagnosis.bound import capacity_at
from monitor.sampling import capacity as cap
from tests.test_diagnosis import feat


def _topology(root, cores: list[int]) -> None:
    """CPU i sits on core cores[i] of package 0."""
    for i, core in enumerate(cores):
        d = root / "devices" / "system" / "cpu" / f"cpu{i}" / "topology"
        d.mkdir(parents=True)
        (d / "core_id").write_text(f"{core}\n")
        (d / "physical_package_id").write_text("0\n")


def test_smt_siblings_are_counted_as_part_of_a_core_until_measured(tmp_path):
    _topology(tmp_path, [0, 1, 0, 1])  # 4 CPUs on 2 cores
    c = cap.capacity(4, affinity={0, 1, 2, 3}, sys_root=str(tmp_path),
                     cache=tmp_path / "none.json")
    assert c.physical == 2 and c.cores == pytest.approx(2 + 2 * cap.SMT_YIELD)
    assert "assumed" in c.source and "doctor" in c.source
    plain = tmp_path / "plain"
    _topology(plain, [0, 1])
    c = cap.capacity(2, affinity={0, 1}, sys_root=str(plain), cache=tmp_path / "none.json")
    assert c.cores == 2.0 and c.source == "the CPU count (not measured)"


def test_a_kept_measurement_is_what_the_advice_reads(tmp_path):
    cpus = sorted(__import__("os").sched_getaffinity(0))
    kept = tmp_path / "capacity.json"
    kept.write_text(json.dumps({cap._key(cpus): {"cores": 1.5 * len(cpus) / 2,
                                                 "usable": len(cpus), "at": 0}}))
    c = cap.capacity(len(cpus), cache=kept)
    assert c.cores == pytest.approx(0.75 * len(cpus)) and c.source.startswith("measured")
    # a quota of one CPU: the measured ratio for what is left
    assert cap.capacity(1, cache=kept).cores <= 1.0


def test_a_measurement_beside_a_busy_neighbour_is_refused_or_holds(tmp_path):
    """Measured for real: one spinning process, then one a CPU; kept where the box was
    quiet enough, refused with a sentence where other processes kept the CPUs busy."""
    got = cap.measure(cache=tmp_path / "c.json", seconds=0.3)
    if isinstance(got, str):
        assert "quieter box" in got and not (tmp_path / "c.json").exists()
    else:
        assert 0.5 <= got.cores <= got.usable and got.source.startswith("measured")
        assert (tmp_path / "c.json").exists()


def test_cap_spreads_over_cores_before_siblings():
    assert capacity_at(2, 2.5, 4, 2) == 2.0  # two tasks: a core each
    assert capacity_at(4, 2.5, 4, 2) == pytest.approx(2.5)
    assert capacity_at(3, 2.5, 4, 2) == pytest.approx(2.25)
    assert capacity_at(2, 1.5, 2, None) == pytest.approx(1.5)  # a VM's vCPUs, no topology
    assert capacity_at(0.5, 1.5, 2, None) == 0.5


def test_the_model_counts_cores_in_one_tasks_work():
    """Two vCPUs that do 1.5x one's work together. A window with both busy measured the
    loaders' CPU per sample at 0.75 of a lone task's speed: the model predicts what it
    measured there. A window with one busy measured a lone task's: more workers get 1.5
    CPUs' worth, not the 2 the CPU count says (a VM's predictions ran 10-25% high)."""
    both = dict(config={**feat().config, "num_workers": 2}, workers_cpu_cores=1.9,
                host_cpu_cores=2.0, main_cpu_cores=0.05, cpu_per_sample_s=0.004,
                wall_per_sample_s=0.004, data_wait_share=0.5)
    counted = fit_bound(feat(**both))
    measured = fit_bound(feat(**both, capacity_cores=1.5, physical_cores=None))
    assert counted.usable == 2.0 and measured.usable == 1.5
    assert measured.cpu_s == pytest.approx(0.75 * counted.cpu_s)
    assert measured.predict(2)[0] == pytest.approx(counted.predict(2)[0], rel=0.1)

    one = {**both, "config": {**feat().config, "num_workers": 1}, "workers_cpu_cores": 0.95,
           "host_cpu_cores": 1.0}
    counted = fit_bound(feat(**one))
    measured = fit_bound(feat(**one, capacity_cores=1.5, physical_cores=None))
    assert measured.cpu_s == pytest.approx(counted.cpu_s)  # a lone task's speed
    assert counted.predict(4)[0] > 1.8 / counted.cpu_s
    assert measured.predict(4)[0] <= 1.5 / measured.cpu_s + 1e-6
