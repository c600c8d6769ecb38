"""GPU check: NVML utilization against the step-derived busy series, on a real GPU.

    python bench/gpu_check.py [--seconds 20]

Runs the `starving` and `healthy` presets (num_workers=0, model size auto: the training pass
is repeated to take about the preset's step time) for about `--seconds` each, then prints per
preset: NVML utilization mean and coefficient of variation, step-derived busy mean and CV,
their correlation in time, the spacing of nvmlDeviceGetSamples time stamps, and the cost of
one sampling pass in microseconds. Expected: starving shows a high CV and low mean on both
series; healthy a flat line near 100%. Then the device's own clock: bench/async_train.py (an
unmodified asynchronous loop, no per-step sync) under `monitor run` at num_workers 0 and 4,
with its CUDA-event idle per step, idle share and busy against NVML's utilization, and each
step phase's device time (forward, backward, optimizer step from events at their boundaries).
Last, at 4 workers with 3 host syncs a step (`--syncs 3`: an .item() between passes): the
syncs the probe counted and the host-syncs finding. Fits in 6 minutes with the defaults.
Figures only; nothing is asserted. Exits 2 with the reason when NVML or CUDA is missing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.assess.devices import workload_gpu
from monitor.assess.window import steady_window
from monitor.config import LoaderConfig
from monitor.frames.analysis import busy_series, nvml_vs_busy, series_stats, span
from monitor.manage.measure import measure
from monitor.manage.runtime import Runtime
from monitor.sampling.gpu import open_backend


def pass_cost_us(gpu, n: int = 40) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        gpu.sample()
        times.append((time.perf_counter() - t) * 1e6)
        time.sleep(0.02)
    return statistics.median(times)


def async_check(seconds: float) -> None:
    """The device's own clock: an unmodified asynchronous script (no per-step sync) under
    `monitor run` at num_workers 0 and 4, its CUDA-event idle per step against NVML."""
    import json
    import subprocess

    root = Path(__file__).resolve().parent.parent
    db = Path(tempfile.mkdtemp()) / "async.db"
    print("\nasynchronous script (bench/async_train.py) under monitor run, CUDA events:")
    for nw, syncs in ((0, 0), (4, 0), (4, 3)):
        r = subprocess.run([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                            "--no-live", "--", sys.executable,
                            str(root / "bench" / "async_train.py"), "--num-workers", str(nw),
                            "--seconds", str(seconds), "--syncs", str(syncs)],
                           cwd=root, capture_output=True, text=True, timeout=seconds + 240)
        if r.returncode != 0:
            print(f"  num_workers {nw}: monitor run failed ({r.returncode}): "
                  f"{r.stderr.strip().splitlines()[-1:]}")
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        from monitor.store import Store

        store = Store(db)
        steps = steady_window(store, d["run_id"]).steps
        start, end = span(steps)
        timed = steps.dropna(subset=["device_idle_s", "device_span_s"])
        idle = timed["device_idle_s"]
        busy = timed["device_span_s"] / (timed["device_span_s"] + timed["device_idle_s"])
        util = store.gpu_util(start, end)
        nv_mean, nv_cv = series_stats(util["util_pct"])
        ev = d.get("evidence") or {}
        print(f"  num_workers {nw}: {d['throughput']:.0f} samples/s, verdict {d['verdict']}; "
              f"events on {len(timed)}/{len(steps)} steps; device idle per step "
              f"{idle.median() * 1e3:.2f} ms median, idle share "
              f"{fmt(ev.get('device_idle_share'), '.1%')}; host data-wait share "
              f"{d['data_wait_share']:.1%}")
        print(f"    event-derived busy mean {busy.mean() * 100:.1f}%  vs NVML utilization "
              f"mean {fmt(nv_mean, '.1f')}% (CV {fmt(nv_cv)}): "
              f"difference {fmt((busy.mean() * 100 - nv_mean) if nv_mean else None, '+.1f')}"
              " points")
        if syncs:  # issue 54: host syncs, counted on a sample of steps (NOTE [counting syncs])
            said = store.events(d["run_id"], kinds=("syncs",))["label"].tolist()
            found = [f["text"] for f in d.get("findings") or () if f["cause"] == "host-syncs"]
            print(f"    --syncs {syncs}: counted {said[-1:] or 'none'}; verdict {d['verdict']}; "
                  f"{found[0] if found else 'no host-syncs finding'}")
        ph = d.get("phases") or {}
        if ph:  # issue 34: each phase's device time per step, from events at its boundaries
            per = ph.get("seconds_per_step") or {}
            print(f"    phases ({ph.get('source')}): " + ", ".join(
                f"{k} {per.get(k, 0) * 1e3:.2f} ms ({ph.get(k, 0):.0%})" for k in
                ("data_wait", "copy", "forward", "backward", "optimizer", "other")))
        else:
            print("    phases: none recorded")


def fmt(v, spec=".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--presets", default="starving,healthy")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: the scripted NVML of the tests and the simulated "
                         "accelerator, to check this script itself")
    ap.add_argument("--async-seconds", type=float, default=40.0,
                    help="each run of the asynchronous script (bench/async_train.py)")
    ap.add_argument("--no-async", action="store_true")
    a = ap.parse_args()
    if a.dry_run:
        from monitor.sampling.gpu.nvml import NvmlBackend
        from tests.fakes import nvml as fk

        gpu = NvmlBackend(fk.make([fk.FakeGpu(util=50.0)]))
    else:
        gpu = open_backend()
    if not gpu.available:
        print(f"no NVML GPU: {gpu.notice}")
        return 2
    print(gpu.notice)
    for d in gpu.devices():
        print(f"  GPU {d.index}: {d.name} uuid={d.uuid} pci={d.pci} GPM={d.gpm}")
    rt = Runtime(Path(tempfile.mkdtemp()) / "gpu_check.db", gpu=gpu).start()
    store = rt.store
    try:
        for preset in a.presets.split(","):
            m = measure(rt, LoaderConfig.build(preset=preset, num_workers=0), a.seconds)
            kind = (store.run(m.run_id) or {}).get("accelerator_kind")
            if kind != "cuda" and not a.dry_run:
                print(f"{preset}: the workload did not run on CUDA ({m.accelerator}); "
                      f"status {m.status} {m.error or ''}")
                return 2
            steps = steady_window(store, m.run_id).steps
            start, end = span(steps)
            dev = workload_gpu(gpu.devices(), (store.run(m.run_id) or {}).get("device"))
            util = store.gpu_util(start, end)
            util = util[util["gpu"] == dev] if dev is not None else util
            nv_mean, nv_cv = series_stats(util["util_pct"])
            busy = busy_series(steps, 0.05, start, end)["busy"] * 100
            b_mean, b_cv = series_stats(busy)
            cmp = nvml_vs_busy(util[util["source"] == "samples"], steps)
            share = (util["source"] == "samples").mean() if len(util) else float("nan")
            print(f"\n{preset}: {m.accelerator}")
            print(f"  steps {m.summary.steps}, throughput {m.summary.throughput:.1f} samples/s, "
                  f"data-wait share {m.summary.data_wait_share:.3f}, NVML GPU {dev}")
            print(f"  NVML utilization     mean {fmt(nv_mean, '.1f')}%  CV {fmt(nv_cv)}  "
                  f"({len(util)} samples, {share:.0%} from GetSamples)")
            print(f"  step-derived busy    mean {fmt(b_mean, '.1f')}%  CV {fmt(b_cv)}")
            spacing_ms = cmp["spacing_s"] * 1e3 if cmp["spacing_s"] else None
            print(f"  correlation in time  {fmt(cmp['correlation'])} over {cmp['pairs']} "
                  f"pairs; GetSamples spacing {fmt(spacing_ms, '.0f')} ms")
        print(f"\nsampling pass cost: {pass_cost_us(gpu):.0f} us median over 40 passes "
              f"({len(gpu.devices())} GPU(s); PCIe read at most once a second)")
        if not a.dry_run and not a.no_async:
            async_check(a.async_seconds)
    finally:
        rt.close()
        gpu.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
