"""The probe times wait and compute per step with an injected clock, and batches writes."""
from __future__ import annotations

import pytest

from monitor.probe.samples import batch_len
from monitor.probe.timing import Probe
from tests.helpers import Clock


class SlowLoader:
    """Each next() advances the fake clock by `wait`; the first iter() by `startup`."""

    def __init__(self, clock, n, wait, startup=0.0):
        self.clock, self.n, self.wait, self.startup = clock, n, wait, startup

    def __iter__(self):
        self.clock.t += self.startup
        for i in range(self.n):
            self.clock.t += self.wait
            yield [list(range(4)), i]


def test_wait_and_compute_are_separated(store):
    run = store.create_run("x", "managed", {})
    clock = Clock(0.0)
    probe = Probe(store, run, flush_interval=1e9, clock=clock, wall=lambda: 500.0)
    for _ in probe.iterate(SlowLoader(clock, 3, wait=0.2, startup=1.0), epoch=0):
        clock.t += 0.05  # the model step
    probe.flush()
    df = store.steps(run)
    assert df["wait_s"].round(6).tolist() == [1.2, 0.2, 0.2]  # start-up is in the first wait
    assert df["compute_s"].round(6).tolist() == [0.05, 0.05, 0.05]
    assert df["samples"].tolist() == [4, 4, 4]
    assert df["ts"].round(6).tolist() == [501.2, 501.45, 501.7]


def test_between_can_end_the_epoch_and_writes_are_batched(store):
    run = store.create_run("x", "managed", {})
    clock = Clock(0.0)
    probe = Probe(store, run, flush_interval=0.5, clock=clock)
    written = []

    def between():
        written.append(len(store.steps(run)))  # after this step's record, before the next
        return len(written) == 5

    n = sum(1 for _ in probe.iterate(SlowLoader(clock, 100, wait=0.13), 0, between))
    assert n == 5
    assert written == [0, 0, 0, 4, 4]  # one write at 0.52 s holds the first four steps
    assert len(store.steps(run)) == 5  # the epoch's end writes the rest


def test_a_plain_loop_records_every_step_and_not_the_exhausting_next(store):
    """The for loop's last next() (StopIteration) records the last step's compute and is no
    step itself."""
    run = store.create_run("x", "managed", {})
    clock = Clock(0.0)
    probe = Probe(store, run, flush_interval=1e9, clock=clock)
    for _ in probe.iterate(SlowLoader(clock, 4, wait=0.1), 0):
        clock.t += 0.3
    df = store.steps(run)
    assert len(df) == 4 and df["compute_s"].round(6).tolist() == [0.3] * 4


def test_batch_len_shapes():
    class T:
        shape = (7, 3)

    assert batch_len(T()) == 7
    assert batch_len((T(), [0] * 7)) == 7
    assert batch_len({"x": T()}) == 7
    assert batch_len([1, 2, 3]) == 1  # a batch whose first item is a scalar
    assert batch_len(object()) == 1
    # the fast paths (a tuple or list led by a tensor, an int) agree with the general one
    assert batch_len([T(), T()]) == 7 and batch_len(5) == 1 and batch_len(True) == 1
    assert batch_len(([(T(), 1)], 0, 0)) == 7  # Lightning's CombinedLoader: looked into
    assert batch_len(()) == 0


def test_a_locked_store_never_blocks_the_watched_steps(tmp_path):
    """Another connection holds the store's write lock from before an epoch starts: the
    epoch's start (its events, its control reads) and its 5,000 steps run to the end while
    it is held (the training thread only appends; the watchdog's thread writes, and retries
    a locked write), and once it is let go every step and event arrives, in order."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from monitor.store import Store
    from tests.conftest import wait_for

    root = Path(__file__).resolve().parent.parent
    db = tmp_path / "locked.db"
    p = subprocess.Popen([sys.executable, str(root / "tests" / "scripts" / "locked_store.py"),
                          "5000"], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(root),
                              "STARVATION_MONITOR_DB": str(db)})
    try:
        lines: list[str] = []
        assert wait_for(lambda: lines.append(p.stdout.readline()) or lines[-1].startswith(
            "looped"), timeout=120), (lines, p.stderr.read() if p.poll() is not None else "")
        # the lock is still held: nothing of the second epoch has been written (read
        # plainly: opening a Store writes its schema, which would wait on the lock too)
        import sqlite3

        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 10
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-2000:]
    assert "stored 5010" in out, (out, err[-2000:])
    steps = Store(db).steps(1)["step"].tolist()
    assert steps == sorted(steps) and len(set(steps)) == 5010


def test_a_write_that_fails_while_locked_is_retried_and_the_oldest_past_the_bound_dropped(
        tmp_path, monkeypatch):
    """The probe's store waits 50 ms on a lock (not 10 s), and another connection holds the
    write lock: the writes fail, the steps are kept and written once it is let go, in order,
    with one stored note; past the bound the oldest are dropped and the note counts them."""
    import sqlite3

    from monitor.probe import timing
    from monitor.store import Store

    monkeypatch.setattr(timing, "BUFFER_MAX", 100)
    store = Store(tmp_path / "r.db")
    run = store.create_run("retry", "attached", {})
    store.db.conn().execute("PRAGMA busy_timeout = 50")
    errors: list[Exception] = []
    probe = timing.Probe(store, run, flush_interval=1e9)
    probe.on_error = errors.append
    lock = sqlite3.connect(tmp_path / "r.db", timeout=0, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    for i in range(60):
        probe.record(0, float(i), i + 0.2, i + 1.0, [0] * 4)
    probe.flush()  # locked: kept
    for i in range(60, 120):
        probe.record(0, float(i), i + 0.2, i + 1.0, [0] * 4)
    probe.flush()  # still locked: 120 kept of a bound of 100
    assert not errors and not probe.stopped
    lock.execute("COMMIT")
    probe.flush()
    steps = store.steps(run)["step"].tolist()
    assert steps == list(range(20, 120)), steps[:5]
    notes = store.events(run, kinds=("probe",))["label"].tolist()
    assert len(notes) == 1 and notes[0].startswith("the store could not be written for ")
    assert "database is locked" in notes[0] and "20 steps dropped" in notes[0], notes


def test_a_forked_child_never_counts_as_the_training_thread():
    """A DataLoader worker forked from the training thread has that thread's ident too: the
    phase hooks would time its transforms' module calls as the loop's forward. The fork
    handler leaves the child's Phases with no training thread (no getpid() a hook call)."""
    import os
    import threading

    from monitor.probe.phases import Phases

    ph = Phases(lambda why: None)
    assert ph.thread == threading.get_ident()
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 where it holds
        os._exit(0 if ph.thread is None and threading.get_ident() is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert ph.thread == threading.get_ident()  # the parent's is untouched


def test_the_writer_wakes_often_while_the_run_is_young_then_seldom(store):
    """NOTE [the writer's wake]: each wake of the writer's thread slows the training loop, so
    it writes every half second for the run's first YOUNG_S (the page's first verdict), then
    every `steady` seconds, the probe's flush interval with it."""
    from monitor.probe.watchdog import YOUNG_S, Watchdog

    run = store.create_run("x", "managed", {})
    clock = Clock(0.0)
    probe = Probe(store, run, flush_interval=0.5, clock=clock)
    dog = Watchdog(probe, interval=0.5, steady=2.0)  # not started: no thread, the rule only
    assert dog.period() == 0.5 and probe.flush_interval == 0.5
    clock.t = YOUNG_S - 0.01
    assert dog.period() == 0.5
    clock.t = YOUNG_S
    assert dog.period() == 2.0 and probe.flush_interval == 2.0
    assert Watchdog(probe, interval=0.5).period() == 0.5  # no steady period: as it was


def test_a_worker_killed_outside_the_loader_is_named_at_exit():
    """torch raises a worker's death from its SIGCHLD handler wherever the loop is (a forward,
    a sleep), so the loader's error path never sees it: at exit the workers' exit codes say
    which a signal ended. A worker stopped (SIGTERM: the loader's own shutdown) is not one."""
    import multiprocessing
    import signal

    from monitor.probe import workers

    ctx = multiprocessing.get_context("fork")
    killed, stopped = ctx.Process(target=signal.pause), ctx.Process(target=signal.pause)
    killed.start()
    stopped.start()
    killed.kill()
    stopped.terminate()
    killed.join(30)
    stopped.join(30)
    assert workers.killed_note([killed, stopped]) == \
        f"DataLoader worker (pid {killed.pid}) is killed by signal: Killed."
    assert workers.killed_note([stopped]) == ""


def test_a_death_raised_by_torchs_handler_inside_the_wait_for_its_exit_code_is_named():
    """A killed worker's batch cut off mid-send raises a reset connection in the loop before
    the worker is reaped; the probe then waits for its exit code, and torch's SIGCHLD handler
    raises the death inside that wait (a cgroup's OOM kill, seen in the suite): the note is
    still torch's words, and nothing of the probe's own raises."""
    import multiprocessing
    import signal
    import threading

    from monitor.probe import workers

    def torch_like(signum, frame):  # torch's _error_if_any_worker_fails, in short
        raise RuntimeError("DataLoader worker is killed by signal: Killed.")

    ctx = multiprocessing.get_context("fork")
    w = ctx.Process(target=signal.pause)
    w.start()
    before = signal.signal(signal.SIGCHLD, torch_like)
    try:
        threading.Timer(0.2, w.kill).start()
        note = workers.exit_note([w], ConnectionResetError(104, "Connection reset by peer"))
    finally:
        signal.signal(signal.SIGCHLD, before)
        w.join(30)
    assert note == f"DataLoader worker (pid {w.pid}) is killed by signal: Killed."


class _Reads:
    """Each sample a 50 ms read (a sleep: no CPU), as a remote or cold store gives, of 20
    fields (a batch's receipt then takes the loop a few ms: a tensor's shared memory is
    fetched from its worker one at a time)."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        import time

        import torch
        time.sleep(0.05)  # sleep-ok: the modelled read, not a wait for a condition
        return {f"f{k}": torch.full((4,), i) for k in range(20)}


def test_batches_queued_are_counted_as_the_loop_asks_not_as_it_receives(store, no_leaks):
    """Two workers in step (each batch 4 reads of 50 ms): the loop waits for both, and the
    second lands behind the first as the loop receives it. Counted at the receipt, each
    long wait read a batch queued (a remote-read loader's wait read 47% made ahead, and was
    named loop-receive); at the ask, a wait for the workers finds none queued, and the next
    step, asked with one queued, is short (on a box whose cores are busy, a receipt takes
    the loop 20-30 ms: a wait for the workers is one of 100 ms or more)."""
    from torch.utils.data import DataLoader

    from monitor.diagnosis.loading import receive

    run = store.create_run("x", "managed", {})
    probe = Probe(store, run, flush_interval=1e9)
    loader = DataLoader(_Reads(), batch_size=4, num_workers=2)
    for _ in probe.iterate(loader, 0):
        pass
    probe.flush()
    steps = store.steps(run)
    assert steps["ready"].notna().sum() >= 20, steps[["wait_s", "ready"]]
    # (where the second worker's batch came first, it was held: the wait is still theirs)
    waited = steps[steps["wait_s"] > 0.1].iloc[1:]
    assert len(waited) >= 4, steps[["wait_s", "ready", "held"]]
    assert (waited["ready"] >= 1).mean() <= 0.25, steps[["wait_s", "ready", "held"]]
    share, _, _ = receive(steps)
    assert share is not None and share < 0.5, (share, steps[["wait_s", "ready", "held"]])
    # the loop thread's own time through each receipt (monitor/probe/thread_clock.py):
    # waiting for workers that sleep, it is blocked, on no CPU and waiting for none
    timed = steps[steps["ready"].notna()]
    assert timed["wait_cpu_s"].notna().all(), timed[["wait_s", "wait_cpu_s"]]
    # (its wait for a CPU read on one receipt in 16: every 16th of this epoch's)
    assert 1 <= timed["wait_runq_s"].notna().sum() <= len(timed) // 16 + 1, len(timed)
    mine = timed["wait_cpu_s"] + timed["wait_runq_s"].fillna(0.0)
    assert (timed["wait_cpu_s"] >= 0).all() and (mine <= timed["wait_s"] + 1e-3).all()
    long = timed["wait_s"] > 0.1  # (together: beside a loaded suite one 138 ms wait read
    # 70 ms on a CPU, where the 13 long waits of that epoch read 8% in all)
    assert mine[long].sum() < 0.5 * timed["wait_s"][long].sum(), \
        timed[["wait_s", "wait_cpu_s", "wait_runq_s"]]


def test_an_untimed_loaders_waits_are_watched_and_its_batches_pass_as_they_came(store):
    """NOTE [an untimed loader's stall]: while the loop waits in an untimed DataLoader's
    `_next_data`, `probe.untimed` says since when, whether for the pass's first batch, and
    which loader; between batches, at its end and after its error it is None; the batches
    are the loader's own, and an iterator is wrapped once."""
    from torch.utils.data import DataLoader, Dataset

    from monitor.probe.untimed import watch_waits

    probe = Probe(store, store.create_run("x", "managed", {}), flush_interval=1e9)
    seen: list = []

    class Seen(Dataset):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> int:
            if i == 5:
                raise ValueError("a broken sample")
            seen.append(probe.untimed)
            return i

    it = iter(DataLoader(Seen(), batch_size=2))
    assert watch_waits(it, probe, "the validation loader")
    assert not watch_waits(it, probe, "again")  # wrapped once
    assert next(it).tolist() == [0, 1] and probe.untimed is None
    assert next(it).tolist() == [2, 3] and probe.untimed is None
    told: list = []
    probe.on_untimed_error = lambda exc, loader, pids: told.append((exc, loader, pids))
    with pytest.raises(ValueError, match="a broken sample"):
        next(it)
    assert probe.untimed is None
    # the loader's own error told, with no workers' pids; its end (StopIteration) not
    assert [(type(e).__name__, what, pids) for e, what, pids in told] == [
        ("ValueError", "the validation loader", [])]
    assert [s[1:] for s in seen] == [(True, "the validation loader")] * 2 + [
        (False, "the validation loader")] * 3
    assert all(0 < s[0] <= probe.clock() for s in seen)
    rest = iter(DataLoader(range(4), batch_size=2))
    assert watch_waits(rest, probe, "four")
    assert [b.tolist() for b in rest] == [[0, 1], [2, 3]] and len(told) == 1
    # inside a timed wait (a pass on probation found to train) the timed loader's own
    # handler tells its error: not told twice, nor as an untimed loader's
    timed = iter(DataLoader(Seen(), batch_size=6))
    watch_waits(timed, probe, "the training loader")
    probe.waiting_since = probe.clock()
    with pytest.raises(ValueError):
        next(timed)
    assert len(told) == 1
    assert not watch_waits(iter([1, 2]), probe, "a list's")  # no _next_data: not watched


def test_the_models_mode_names_an_evaluation_only_where_the_model_trained_in_training_mode():
    """model.eval() before a pass with gradients on is an evaluation (NOTE [a loader built
    each epoch]): read from the step's outermost modules that hold parameters, and only
    where they trained in training mode."""
    from types import SimpleNamespace

    import torch

    from monitor.probe.choice import LoaderChoice
    from monitor.probe.loops import training_mode

    student, teacher, loss = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.MSELoss()
    teacher.eval()  # a frozen teacher beside the model that trains: still training
    assert training_mode([student, teacher, loss]) is True
    assert training_mode([loss]) is None  # no parameters: no word
    student.eval()
    assert training_mode([student, teacher, loss]) is False
    choice = LoaderChoice()
    choice.mode_in_step = False
    choice.probe = SimpleNamespace(phases=SimpleNamespace(
        roots={1: student, 2: teacher, 3: loss}, trained_mode=True))
    assert choice.model_in_eval()
    choice.mode_in_step = True  # the script's step sets the mode: not read again
    assert not choice.model_in_eval()
    choice.mode_in_step = False
    choice.probe.phases.trained_mode = False  # it trained in eval mode (a frozen BatchNorm)
    assert not choice.model_in_eval()
    choice.probe.phases.trained_mode, choice.probe.phases.roots = True, {3: loss}
    assert not choice.model_in_eval()
    student.train()
    choice.probe.phases.roots = {1: student, 2: teacher}
    assert not choice.model_in_eval()
    choice.probe.phases = None  # phases off: the gradients' word alone
    assert not choice.model_in_eval()
