"""The main process's CPU a step, split: the step's own (a CPU step on torch's intra-op
pool: its threads at work) and the loop's own receiving beside the workers (o_cpu in
bound.py's model), read from the window's features. Pure."""
from __future__ import annotations

import math

from monitor.diagnosis.features import Features
from monitor.thresholds import MAIN_RECEIVE_S, STEP_ON_CPU

# NOTE [the step's own CPU]
# The main process's CPU a step beside workers is its receiving (o_cpu) once the step's own
# CPU is taken off: on the host's CPU, the step's time on each of its threads at work. Its
# time is the mean a step, not the median: a checkpoint saved inside every 25th step
# (torch.save of 60 MB, 100-240 ms) is the step's CPU too. With the median (1.4 ms) it read
# as receiving, 4.9 ms a step where the workers' shared batches are received; spread by the
# main process's share of a core beside two loaders (8.4 ms) it made one worker look
# faster: "num_workers 2 → 1: predicted 1,941 samples/s, +71%", where one worker measured
# 3.05-3.14 s against 2.23-2.43 s bare for the same epochs.


def step_threads(f: Features) -> float:
    """P: the threads of the main process a step on the host's CPU runs on (its busy
    threads, at most the usable cores), where the step keeps at least STEP_ON_CPU of a core
    busy (its CPU per step, less the data wait's, against its time); else 0."""
    if f.accelerator != "cpu" or f.main_cpu_cores is None or f.steps <= 0 \
            or not f.compute_per_step_s or math.isnan(f.wait_per_step_s):
        return 0.0
    step_cpu = main_cpu_a_step(f) - f.wait_per_step_s
    return pool(f) if step_cpu / f.compute_per_step_s >= STEP_ON_CPU else 0.0


def main_cpu_a_step(f: Features) -> float:
    """The main process's CPU seconds a step over the window (main CPU cores measured)."""
    return (f.main_cpu_cores or 0.0) * f.window_s / f.steps


def pool(f: Features) -> float:
    """The main process's threads at work, at least one, at most the usable cores."""
    return max(1.0, min(f.main_busy_threads or 1.0, float(f.usable_cores)))


def main_per_step(f: Features) -> float | None:
    """o_cpu: the main process's CPU per step beside workers outside its step (receiving,
    unpickling, rebuilding the tensors), at most the data wait a step, where that work
    happens (the probe's wait is the `next()` that receives; the loop's own code after it
    is in the step's time, d). Where the step runs on the host's CPU its own CPU is taken
    off: the step's time on each of the main process's threads at work (torch's intra-op
    pool runs it on all of them). At num_workers=0 (not measurable: the main process loads)
    MAIN_RECEIVE_S a batch, as measured on this box (bench/predictions.py).

    Without the cap and the threads, a CPU step on a pool of two (torchvision's mobilenet,
    tests/scripts/vision_train.py -j 2) read as 113 ms of "the loop's own time" beside a
    61 ms step: the bound said 46 samples/s where the run measured 116, and every other
    setting with workers was predicted at less than half its speed."""
    if f.num_workers == 0 or f.main_cpu_cores is None or f.steps <= 0:
        return MAIN_RECEIVE_S if f.steps > 0 else None
    per = main_cpu_a_step(f)
    if f.accelerator == "cpu":  # NOTE [the step's own CPU]
        mean = (f.window_s - (f.between_epochs_s or 0.0)) / f.steps - f.wait_per_step_s
        per -= max(f.compute_per_step_s, mean) * pool(f)
    if not math.isnan(f.wait_per_step_s):
        per = min(per, f.wait_per_step_s)
    return max(0.0, per)
