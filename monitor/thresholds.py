"""Every threshold of the project, each with where it comes from. Nothing else defines one.

Grouped by who reads them: the verdict rules, the bound model and advice, the sweep and
autotune search, and the measurement windows. Changing a number here changes it everywhere.
"""
from __future__ import annotations

import math
import os
import statistics

# -- verdicts --------------------------------------------------------------------------------
# The device waits on data for at least this share of step time: starving. 10% is where the
# PyTorch profiler's and Lightning's own "dataloader bottleneck" hints start to fire, and
# below it a loader change rarely buys more than the run-to-run noise on a shared host.
STARVING_SHARE = 0.10
BY_THE_LINE = 0.02  # a share this near STARVING_SHARE is written to a tenth (by_the_line)
# Host CPU busy over the usable cores above which more loader processes cannot run in
# parallel: 85% leaves room for the sampling jitter of 0.25 s psutil readings.
CPU_SATURATED = 0.85
# A verdict's line crossed by less than NOISE_Z (below) standard errors of its figure (over
# the window's sub-windows and host passes) is borderline, and borderline is taken one way,
# the way that advises no change (fed, cores busy, loaders contended), so that two identical
# runs agree (bench/predictions.py --repeat: a quiet 2-worker run read "starving, 3
# workers" and "cpu-bound" in turn; bare, 3 workers measured x0.97). The CPU busy fraction's
# own noise is at least CPU_BUSY_NOISE, from run to run: four identical quiet runs read
# 0.77, 0.83, 0.86 and 0.88 busy, each with a standard error of 0.01 over its passes (the
# spread is between runs, not within one).
CPU_BUSY_NOISE = 0.05
# The loaders' own time split (/proc schedstat: on a CPU, waiting for one, blocked). Blocked
# for at least this share of their time: they mostly wait on something that is not a CPU
# (storage, a lock, a sleep), so workers beyond the core count still help.
LOADERS_BLOCKED_SHARE = 0.5
# ... and io-bound is claimed only when they read at least this much per sample from the
# block device (/proc io read_bytes): the storage evidence. A loader blocked without such
# reads (its files in the page cache, a sleep, a lock, a socket) waits on something else.
STORAGE_READ_KB = 1.0
# Waiting for a CPU for at least this share of their time: CPU contention (other processes,
# or more loaders than cores). The fair scheduler shares the cores per runnable process, so
# more workers still take a larger share from the others (bound.py: cores_for). A quarter
# is well above the run-queue wait of an idle 2-core host (a few %).
RUNQ_CONTENTION_SHARE = 0.25
# Below this share of their runnable time waiting for a CPU, the loaders were not short of
# one: the others' runnable count is not read from it (a few % is an idle host's noise).
CONTENTION_MIN_WAIT = 0.05
# Time lost at epoch starts over the window above which restarting workers per epoch matters.
EPOCH_STALL_SHARE = 0.10
# A tail stall: a step whose data wait is at least SPIKE_X median steps (and SPIKE_MIN_S).
# When such steps hold TAIL_WAIT_SHARE of the window's data wait, a few slow batches (a cold
# file, a slow sample, a GC pause), not a slow pipeline, are what the device waits for.
SPIKE_X = 5.0
SPIKE_MIN_S = 0.005
TAIL_WAIT_SHARE = 0.5
# ...and such steps are rare: at most this share of steps, and at most half a step per
# worker (n workers hand over batches in rounds: one step in n waiting is the pipeline).
TAIL_MAX_STEP_SHARE = 0.05
TAIL_ROUND_SHARE = 0.5  # ... and at most this many steps a round of n workers
# Warm-up: the run's first steps, until one takes at most WARMUP_SETTLED_X median steps
# (read from the first WARMUP_READ_STEPS); time they took beyond median steps is the run's
# warm-up, which dominates a run when it is WARMUP_DOMINANT_SHARE of the run's stepping.
WARMUP_SETTLED_X = 2.0
WARMUP_READ_STEPS = 200
WARMUP_DOMINANT_SHARE = 0.5
# Host-to-device copy time over compute above which the copy, not the model, is the step.
TRANSFER_SHARE = 0.30
# CPU taken by processes outside the workload above which the verdict names them: half a
# core is more than the sampling noise of the host total minus the workload's own.
OTHER_LOAD_CORES = 0.5
# A rank is an input straggler when its data wait per step is at least STRAGGLER_RATIO times
# the median of the other ranks' and STRAGGLER_MIN_S more: twice, because ranks on one host
# differ by tens of percent from placement alone; 5 ms, below which a step barely notices.
STRAGGLER_RATIO = 2.0
STRAGGLER_MIN_S = 0.005
# Fewest steps a window needs before any verdict is given.
VERDICT_MIN_STEPS = 3
# cgroup CPU throttling above this share of the window's periods is named in the verdict:
# a tenth of the periods throttled costs more than the sampling noise.
CPU_THROTTLED_SHARE = 0.1
# The bound model's floor for the cores left to loaders (other processes may take the rest,
# but a loader still gets a time slice) and the main process's own CPU at num_workers=0.
MIN_LOADER_CORES = 0.5
MAIN_IDLE_CORES = 0.05
# the main process's CPU to receive one batch from a worker (unpickle, rebuild tensors, the
# loop): its ceiling beside workers where a window at num_workers=0 cannot measure it
MAIN_RECEIVE_S = 0.0007
# ... and the wall time a batch's hand-offs between a worker and the main process take on
# top of it when the CPUs are busy (each waits for one): 2.3 ms beyond the step at 2 busy
# workers against 0.9 ms with idle CPUs, bare on the 2-core box (bound.py, o)
MAIN_HANDOFF_S = 0.0015
# A step "on the host's CPU" (bound.py, NOTE [a step on the loaders' CPUs]) keeps at least
# this share of a core busy through its time: a torch model's forward and backward on the
# CPU read 1.7-1.8 cores (two threads), a modelled step that sleeps ~0.
STEP_ON_CPU = 0.5
# A device gap shorter than this between two steps is not counted as idle (timer noise).
IDLE_GAP_MIN_S = 0.005
# A busy series is a sawtooth when it varies (std >= SAWTOOTH_MIN_STD) and repeats
# (autocorrelation peak >= SAWTOOTH_MIN_AC).
SAWTOOTH_MIN_STD = 0.05
SAWTOOTH_MIN_AC = 0.2

# -- memory ----------------------------------------------------------------------------------
# Share of the memory budget (or of the machine's memory) above which the verdict is
# memory-pressure and above which the sweep will not start a configuration: 85%, as
# Kubernetes' default eviction margin and earlyoom's defaults sit around 10-15% free.
MEMORY_HEADROOM = 0.85
BUDGET_ENV = "STARVATION_MONITOR_MEMORY_BUDGET_MB"

# -- bound model and advice ------------------------------------------------------------------
# Advise a change only when it is predicted to gain at least this much (noise on a shared
# host is about ±5%).
MIN_GAIN = 1.10
# The knee: the cheapest setting within this share of the best (predicted for advice,
# measured for a sweep). More processes cost memory and start-up for the last few percent.
KNEE_SHARE = 0.97
# Per-step cost in the main process with workers on (collate, queue, unpickle), when the
# window cannot show it: about a millisecond in torch's own DataLoader benchmarks.
DEFAULT_OVERHEAD_S = 0.001

# -- search (sweep, tune) --------------------------------------------------------------------
# A step of the hill climb must gain more than this to be taken; below it is the plateau.
MIN_STEP_GAIN = 0.03
# Live autotune: a stretch (an epoch, N steps) shorter than this is pooled with the next one;
# below 20 steps the batch-means noise of a stretch is mostly worker start-up.
AUTOTUNE_MIN_STEPS = 20

# -- predictions checked against outcomes (monitor/assess/outcomes.py) ----------------------
# An outcome needs this many steps of its setting (after its start-up) and reads at most
# OUTCOME_MAX_STEPS; one outcome's measured / predicted is clipped to OUTCOME_SCALE_RANGE,
# and a limit's learnt scale is the mean of about the last OUTCOME_SCALE_MEMORY outcomes.
OUTCOME_MIN_STEPS = 10
OUTCOME_MAX_STEPS = 200
OUTCOME_SCALE_RANGE = (0.5, 1.5)
OUTCOME_SCALE_MEMORY = 10

# -- noise (compare, the tune search, live autotune) ---------------------------------------------
# A measurement's noise is the standard error of its parts' throughputs (batch means): the
# steady window cut into NOISE_PARTS consecutive parts, SE = stdev(parts) / sqrt(parts). Two
# measurements differ beyond the noise when |B - A| > NOISE_Z x sqrt(SE_A² + SE_B²): about
# 95% for normal part-to-part noise.
NOISE_PARTS = 5
NOISE_Z = 2.0
# Identical runs (the same command, settings and host) spread wider than one run's own
# standard error says: their data-wait shares differ by this much more, from run to run
# (NOTE [identical runs] in monitor/assess/same_runs.py: ten quiet runs of one loop read
# 9.94-11.20%, a standard deviation of 0.43 points, each run's own error 0.06-0.23).
RUN_TO_RUN_WAIT = 0.004
# The regression gate knows the host: a slower run B is "inconclusive", not a regression, when
# its host was busier than A's by at least HOST_BUSIER_CORES of other processes' CPU, or its
# loaders waited for a CPU at least HOST_BUSIER_RUNQ more of their time (on a saturated host
# other processes' CPU cannot grow, the loaders' wait still does), or its device step
# differs by more than HOST_STEP_CHANGE (a recalibrated simulated step): the environment,
# not the settings, explains the difference.
HOST_BUSIER_CORES = 0.5
HOST_BUSIER_RUNQ = 0.10
HOST_STEP_CHANGE = 0.10

# A dataset held in memory by every rank on a host (diagnosis/per_rank.py): each rank's
# copy at least this big, and the largest within CACHE_RANK_ALIKE of the smallest (the same
# data, loaded once per rank). Below 100 MB a copy per rank costs less than a rank's torch.
CACHE_RANK_MIN_MB = 100.0
# A process's threads at work at once (each wanting a CPU a fifth of a pass or more) past
# this, on average over the window: a pool at work beside the one thread a loader needs
# (diagnosis/threads.py).
THREADS_AT_WORK = 1.5
# The main process's pool beside other processes (monitor/diagnosis/threads.py): others
# busy this many cores, and its threads at work getting under this share of a core each
OTHERS_BUSY_CORES = 0.5
MAIN_CPU_GOT = 0.75
# The loaders read over the network when a TCP peer of theirs was seen in at least this
# share of a window's passes (a connection a request, open while the loader waits on it).
REMOTE_SEEN_SHARE = 0.3
CACHE_RANK_ALIKE = 1.25

# -- faults ----------------------------------------------------------------------------------
# No batch for this long means the loader looks stuck: at least STALL_MIN_S, and
# STALL_STEPS typical steps (a job whose steps take 2 s is not stuck after 10 s). Slower than
# any healthy epoch start we have seen (worker start-up plus a full prefetch queue: ~3 s).
STALL_MIN_S = 10.0
STALL_STEPS = 20
STALL_ENV = "STARVATION_MONITOR_STALL_MIN_S"  # tests shorten STALL_MIN_S
# Waiting for an epoch's first batch includes starting its workers and opening the dataset:
# the run's first one gets STARTUP_ALLOWANCE_S (STARTUP_ENV overrides it), a later epoch's
# FIRST_BATCH_X times the run's own first batch (measured), never less than the floor above.
STARTUP_ALLOWANCE_S = 30.0
STARTUP_ENV = "STARVATION_MONITOR_STARTUP_S"
FIRST_BATCH_X = 3.0
# At a measurement's deadline, a loop with no step for QUIET_MIN_S and QUIET_STEPS typical
# steps may be stuck: the measurement waits for its watchdog's verdict (up to the limit).
QUIET_MIN_S = 1.0
QUIET_STEPS = 5

# A managed workload's settings are proven good after this many steps: a failure later (a
# worker killed, out of memory) under a newer setting goes back to them, not down with it.
PROVEN_STEPS = 20

# -- windows ---------------------------------------------------------------------------------
# Discarded start of a measured window: worker start-up and the first batches. A fifth of
# the window, at most WARMUP_MAX_S. Used by measure, attached runs, sweeps and the page
# (after a loader change).
WARMUP_FRACTION = 0.2
WARMUP_MAX_S = 2.0
# The steady state of a long run is its last STEADY_MAX_S of the final settings: ten minutes
# hold thousands of steps (plenty for every figure), and an hours-long run opens at once.
STEADY_MAX_S = 600.0
# The page's KPI window: the last this-many seconds.
KPI_WINDOW_S = 10.0


def std_error(values: list[float]) -> float | None:
    """The standard error of a mean of parts (None below two parts): the one noise formula."""
    vals = [float(v) for v in values]
    if len(vals) < 2:
        return None
    return statistics.stdev(vals) / math.sqrt(len(vals))


def noise_band(errors: list[float | None]) -> float:
    """NOISE_Z x the combined standard error of the measurements whose errors are known."""
    known = [e for e in errors if e is not None]
    return NOISE_Z * math.sqrt(sum(e * e for e in known)) if known else 0.0


def by_the_line(share: float, line: float = STARVING_SHARE, near: float = math.inf) -> str:
    """A share as a percentage to a tenth, or a hundredth where a tenth would round it onto
    the line it is judged against ("10.0% (below 10%)" was 9.95%); further than `near` from
    the line, whole ("starving: waits for data 10%" was 10.4%, "61%" stays 61%)."""
    if abs(share - line) >= near:
        return f"{share:.0%}"
    text = f"{share:.1%}"
    return f"{share:.2%}" if (share < line) != (float(text[:-1]) / 100 < line) else text


def warmup_seconds(seconds: float) -> float:
    """Warm-up to discard from a window of `seconds`."""
    return min(WARMUP_MAX_S, WARMUP_FRACTION * max(0.0, seconds))


def _env_s(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


def stall_limit_s(median_step_s: float | None, first_batch: bool = False,
                  run_first_batch_s: float | None = None) -> float:
    """Seconds without a batch after which the loader is reported stuck: STALL_MIN_S and
    STALL_STEPS typical steps; waiting for an epoch's first batch, the start-up allowance
    (the run's first: STARTUP_ALLOWANCE_S; a later epoch's: FIRST_BATCH_X x the run's first
    batch, measured)."""
    floor = _env_s(STALL_ENV, STALL_MIN_S)
    limit = max(floor, STALL_STEPS * (median_step_s or 0.0))
    if first_batch:
        startup = FIRST_BATCH_X * run_first_batch_s if run_first_batch_s is not None \
            else _env_s(STARTUP_ENV, STARTUP_ALLOWANCE_S)
        limit = max(limit, startup)
    return limit


def memory_budget_mb(explicit: float | None = None) -> float | None:
    """The one memory-budget resolver: an explicit budget, else $STARVATION_MONITOR_MEMORY_
    BUDGET_MB, else None (callers then judge against the machine's memory)."""
    if explicit is not None:
        return float(explicit)
    env = os.environ.get(BUDGET_ENV)
    try:
        return float(env) if env else None
    except ValueError:
        return None

# A calibrated preset's per-sample loading cost is measured again at each run's start; a
# fresh figure further than this from the stored one replaces it (a store first used on a
# busy box kept 13.3 ms a sample where the quiet box measures 4.3 ms).
CALIBRATION_NOISE = 0.25
CALIBRATION_REUSE_S = 600.0  # a figure this recent stands: a session's runs meet one device

# The causes in monitor/diagnosis/causes.py.
IDLE_WORKER_MIN_BATCHES = 20  # batches in the window before a worker with none is idle
# Worker start-up: an epoch's first batch, from its iter(), at least this long (and
# STARTUP_STEPS_X median steps) with workers that are not kept between epochs.
STARTUP_MIN_S = 0.3
STARTUP_STEPS_X = 5.0
# Per-sample overhead: a batch of at least this many samples, each costing the loop no more
# than this to fetch and collate one at a time (a Python call per sample is a few µs; a
# decoded image is milliseconds), with the loop waiting at least PER_SAMPLE_WAIT_SHARE of
# its time: the per-sample calls, not the data, are the cost. (Batches of 64 handed over by
# persistent workers read 25 µs a sample at a 14% wait: a hand-off, not this.)
PER_SAMPLE_MIN_BATCH = 128
PER_SAMPLE_MAX_S = 20e-6
PER_SAMPLE_WAIT_SHARE = 0.3
MEM_GROWTH_MB_MIN = 30.0  # workers' memory growing faster than this (MB/min, all together)
MEM_GROWTH_MIN_S = 5.0  # ... over at least this long a stretch of the window
MEM_GROWTH_MIN_TOTAL_MB = 32.0  # ... and by at least this much in it (not warm-up)
SHM_HEADROOM = 0.8  # in-flight batches past this share of /dev/shm's free space: it fills
FD_HEADROOM = 0.8  # descriptors in flight past this share of `ulimit -n`
# A worker that died without saying how (torch's "exited unexpectedly", a batch cut off
# mid-send) while the memory it could use had less than this left (MB, host or cgroup, at
# the fullest sample): the kernel's OOM killer, most likely (its SIGKILL reaped too late for
# the loop's error to say so)
OOM_ROOM_MB = 256.0
# torch.compile's recompiles (monitor/diagnosis/compiles.py): a step whose compute took this
# many times the window's median and this much more, in the steps of a look at dynamo that
# found new graphs, is a step that compiled
COMPILE_STALL_X = 2.5
COMPILE_STALL_MIN_S = 0.05
# Host syncs on CUDA (monitor/diagnosis/syncs.py): a step that stops the host this many times
# on a synchronizing call, with the GPU busy less than this share of the time (NVML, %)
SYNCS_MIN_PER_STEP = 1.0
SYNC_BUSY_MAX_PCT = 80.0
HOL_WAIT_X = 5.0  # a wait this many times the median, with finished batches held behind it
HOL_SHARE = 0.5  # ... holding this share of the window's data wait: head-of-line
# the loop's wait is its own receiving of batches its workers made ahead (NOTE [the loop's
# receive] in monitor/diagnosis/costs.py) where this share of the data wait or more is on
# steps received with a further finished batch queued behind theirs and none held (measured:
# every step of a loop whose receiving was the wait, one in ten of two storage-bound
# workers'; bench/repro/loader.py), over at least this many steps that counted it
AHEAD_SHARE = 0.5
AHEAD_MIN_STEPS = 20
# ... and the share of that wait the loop's thread was blocked, neither on a CPU nor waiting
# for one, at or over which the finding says the workers' hand-off held it (NOTE [the loop's
# receive]: 51-67% from workers busy in Python, 4-40% where receiving is the loop's work)
RECEIVE_HELD_SHARE = 0.5
# ... the loop's wait for a CPU, read on one receipt in RUNQ_EVERY (monitor/probe/
# thread_clock.py), from at least this many of them
RUNQ_MIN_STEPS = 5
# ... and longer than this many times a worker's turn (workers x the median step): a uniform
# pipeline in order waits one turn for every n-th batch while the next sits finished
HOL_BATCH_X = 1.5
# The run's own history (monitor/assess/history.py): a generation's first steps (at least
# HISTORY_SKIP_STEPS, or the workers' queue) are its start-up, not its rate; one counts with
# HISTORY_MIN_STEPS after them, and is final HISTORY_FINAL_S after the next one began (the
# probe's writer is behind by up to its flush interval). More workers made it slower: a
# generation with fewer workers measured at least SLOWER_SHARE more than the one now.
HISTORY_SKIP_STEPS = 5
HISTORY_MIN_STEPS = 30
HISTORY_FINAL_S = 2.0
SLOWER_SHARE = 0.10

# The loading bound (monitor/diagnosis/bound.py): a workers' limit within this factor of the
# cores' rate is the cores' (one more worker would meet the cores anyway).
CORES_TIE_X = 1.05
# The device's own clock (frames/analysis.device_timing) is read when at least this share
# of the window's steps (and VERDICT_MIN_STEPS) carry it.
DEVICE_CLOCK_MIN_SHARE = 0.5
# NVML alignment (frames/analysis): steps' device busy is summed in bins this long (s).
ALIGN_BIN_S = 0.01
# `monitor compare`'s gate: a slowdown past this share (%), beyond the runs' noise, fails.
MAX_REGRESSION_PCT = 5.0
