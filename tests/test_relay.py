"""The relay (NOTE [the relay] in monitor/manage/relay.py): under `monitor run` the script's
steps leave its process through a ring (memory handed to `monitor run`'s socket, or a file)
and are written by `monitor run`'s own process.
Every step arrives, in order, after a normal exit, an exception in the loop, SIGTERM and
SIGKILL; a locked store never holds the loop; the ring's records round-trip; no thread or
folder is left behind."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pandas as pd
import psutil
import pytest

from monitor.manage.relay import Relay
from monitor.ring import DEVICE, STEP, STEP_PENDING, SUFFIX, RingReader, RingWriter, as_device
from monitor.store import ATTACHED, Store
from tests.conftest import wait_for
from tests.helpers import probe_step

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "relay_loop.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def start(db: Path, n: int, mode: str, folder: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "monitor", "run", "--db", str(db), "--json",
                             "--", sys.executable, str(SCRIPT), str(n), mode, str(folder)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def whole(store: Store, run_id: int, n: int) -> None:
    """Steps 0..n-1, each once, stamped in order."""
    steps = store.steps(run_id)
    assert steps["step"].tolist() == list(range(n)), steps["step"].tolist()[-5:]
    assert steps["ts"].is_monotonic_increasing
    assert (steps["samples"] == 1).all() and steps["wait_s"].notna().all()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["normal", "raise"])
def test_every_step_arrives_in_order_after_an_exit_or_the_loops_own_error(mode, tmp_path,
                                                                          no_leaks):
    p = start(tmp_path / "r.db", 400, mode, tmp_path)
    out, err = p.communicate(timeout=180)
    assert p.returncode == (0 if mode == "normal" else 1), err[-2000:]
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
    # the loop's own error reaches the loop at step 200: the steps before it are whole
    whole(Store(tmp_path / "r.db"), run_id, 400 if mode == "normal" else 200)
    assert ("the loop's own error" in err) == (mode == "raise")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to monitor run", "SIGKILL to the script"])
def test_a_stopped_or_killed_script_loses_no_step(how, tmp_path, no_leaks):
    db = tmp_path / "r.db"
    p = start(db, 300, "kill", tmp_path)
    assert wait_for(lambda: (tmp_path / "looped").exists(), timeout=120), p.stderr
    store = Store(db)
    run = store.run(int(store.runs()["id"].iloc[0]))
    if how.startswith("SIGTERM"):
        p.send_signal(signal.SIGTERM)  # forwarded to the script's process group
    else:
        os.kill(int(run["pid"]), signal.SIGKILL)
    p.communicate(timeout=120)
    whole(store, int(run["id"]), 300)
    assert store.run(int(run["id"]))["status"] != "running"


@pytest.mark.slow
def test_a_locked_store_never_holds_the_loop_and_its_steps_arrive_once_freed(tmp_path,
                                                                            no_leaks):
    """Another writer takes the store as soon as the run exists, while `monitor run` is
    still starting the script (a busy box once gave it the lock before the script's pid was
    written: `monitor run` died of "database is locked", and the script with it)."""
    db = tmp_path / "r.db"
    p = start(db, 2000, "hold", tmp_path)
    try:
        lock = sqlite3.connect(db, timeout=30, isolation_level=None)

        def created() -> int | None:
            """The lock taken in the moment the run row exists (polled every 5 ms)."""
            try:
                lock.execute("BEGIN EXCLUSIVE")
            except sqlite3.OperationalError:  # the store being made
                return None
            try:
                row = lock.execute("SELECT max(id) FROM runs").fetchone()
            except sqlite3.OperationalError:  # no table yet
                row = (None,)
            if row[0] is None:
                lock.execute("COMMIT")
            return row[0]

        run_id = wait_for(lambda: db.exists() and created(), timeout=90, every=0.005)
        assert run_id  # another writer holds the store from here, through the loop
        try:
            (tmp_path / "go").touch()
            looped = wait_for(lambda: (tmp_path / "looped").exists() or p.poll() is not None,
                              timeout=120) and (tmp_path / "looped").exists()
            assert looped, ("the loop waited on the locked store" if p.poll() is None else
                            f"monitor run ended {p.poll()}: {p.communicate()[1][-2000:]}")
        finally:
            lock.execute("COMMIT")
            lock.close()
        (tmp_path / "release").touch()
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-2000:]
    store = Store(db)
    assert store.run(run_id)["pid"] is not None  # written once the store was free
    whole(store, run_id, 2000)
    notes = store.events(run_id, kinds=("probe",))["label"].tolist()
    assert not any("dropped" in t and "no step lost" not in t for t in notes), notes


@pytest.mark.slow
def test_a_script_whose_monitor_run_is_killed_ends_with_it(tmp_path):
    """`monitor run` killed outright: the script dies with it, as it would with its
    launcher's group bare (NOTE [bound to monitor run] in monitor/probe/lifeline.py), never
    left training as an orphan; its probe writes what the relay had not read, ends the run
    as killed and kills its group (NOTE [bound to monitor run], 4)."""
    db = tmp_path / "r.db"
    p = start(db, 300, "orphan", tmp_path)
    assert wait_for(lambda: (tmp_path / "looped").exists(), timeout=120), p.stderr
    store = Store(db)
    run = store.run(int(store.runs()["id"].iloc[0]))
    script = psutil.Process(int(run["pid"]))
    tmp = os.environ.get("TMPDIR") or tempfile.gettempdir()  # monitor run's (conftest.py)
    relay_dirs = {d for d in Path(tmp).glob("starvation-relay-*")
                  if any(d.glob(f"{run['pid']}-*.events"))}
    p.kill()  # monitor run only: the script is in a process group of its own
    assert wait_for(lambda: p.poll() is not None, timeout=60)
    gone = wait_for(lambda: not script.is_running() or script.status() == psutil.STATUS_ZOMBIE,
                    timeout=30)
    assert gone, "the script outlived its killed monitor run"
    assert not (tmp_path / "looped2").exists()  # it never ran its second epoch
    # its probe took back what the ring held unread and wrote it before it ended: every
    # step of the first epoch, once, in order, and the run ended as killed
    whole(store, int(run["id"]), 300)
    ended = store.run(int(run["id"]))
    assert ended["status"] == "failed" and "killed" in ended["error"], ended
    assert not any(d.exists() for d in relay_dirs)


def test_a_ring_that_stops_gaining_steps_is_poked_ever_less_often_then_once_on_resuming():
    """The script's watchdog wakes only when poked: after POKE_S without a step, then at
    doubling intervals up to POKE_MAX_S (an evaluation loop that is not timed pays a wake
    every 2 s at most), and once when steps come again (the stall it saw can end)."""
    from monitor.manage.relay import POKE_MAX_S, POKE_S, _Ring

    at: list[float] = []
    now = 0.0

    class Reader:  # the FIFO's writer: when it was poked
        def poke(self) -> bool:
            at.append(now)
            return True

    ring, relay = _Ring(Reader()), Relay.__new__(Relay)  # (_poke reads no relay state)
    ring.changed = 0.0
    for i in range(1, 41):  # 10 s without a step, read every 0.25 s
        now = i * 0.25
        relay._poke(ring, now, 0, False)
    assert at[:4] == [POKE_S, 1.0, 2.0, 4.0]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert max(gaps) == POKE_MAX_S and gaps[-1] == POKE_MAX_S
    now = 10.25
    relay._poke(ring, now, 3, False)  # steps again: one poke, and the schedule starts over
    assert at[-1] == 10.25 and not ring.idle and ring.every == POKE_S
    relay._poke(ring, 10.5, 2, False)
    assert at[-1] == 10.25


def test_the_rings_records_round_trip_with_device_times_merged(tmp_path):
    """A step, a step awaiting its device times and those times (NaN and -1 for None) come
    out of the relay as the steps table's rows; a step whose times never come is written
    without them once the script has ended."""
    store = Store(tmp_path / "s.db")
    run_id = store.create_run("r", ATTACHED, {})
    relay = Relay(store.path, run_id)
    w = RingWriter(relay.folder, 3, anchor_clock=100.0, anchor_wall=1_000.0)
    w.put(STEP, probe_step(0, 101.0, wait_s=0.5, compute_s=0.25, samples=8, forward_s=0.1,
                           backward_s=0.1))
    w.put(STEP_PENDING, probe_step(1, 102.0, wait_s=0.5, compute_s=0.25, samples=8,
                                   copy_s=0.01, worker=2, held=1, ready=3, forward_s=0.1,
                                   backward_s=0.1, optimizer_s=0.05))
    w.put_device(1, 0.2, 0.3, (0.11, 0.12, None))
    w.put(STEP_PENDING, probe_step(2, 103.0, wait_s=0.5, compute_s=0.25, samples=8, worker=0,
                                   held=0))
    w.event(1_002.5, "probe", "a note", {"x": 1})
    relay.stop()  # the script has ended: the step still awaiting its times goes as it is
    rows = store.steps(run_id)
    assert rows["step"].tolist() == [0, 1, 2] and (rows["rank"] == 3).all()
    assert rows["ts"].tolist() == [1_001.0, 1_002.0, 1_003.0]
    first, second, third = (rows.iloc[i] for i in range(3))
    assert pd.isna(first["copy_s"]) and pd.isna(first["optimizer_s"])
    assert pd.isna(first["worker"]) and first["forward_s"] == 0.1
    assert second["device_idle_s"] == 0.2 and second["device_span_s"] == 0.3
    assert second["forward_s"] == 0.11 and pd.isna(second["optimizer_s"])  # device time
    assert second["worker"] == 2 and second["held"] == 1 and second["copy_s"] == 0.01
    assert second["ready"] == 3 and pd.isna(first["ready"])
    assert pd.isna(third["device_span_s"]) and pd.isna(third["forward_s"])
    assert store.events(run_id, kinds=("probe",))["label"].tolist() == ["a note"]
    assert not os.path.exists(relay.folder)
    assert not [t for t in threading.enumerate() if t.name == "starvation-relay"]


def test_a_reader_lapped_by_the_writer_counts_what_it_lost(tmp_path):
    w = RingWriter(str(tmp_path), 0, 0.0, 0.0, capacity=8)
    r = RingReader(w.path)
    for i in range(5):
        w.put(STEP, probe_step(i, float(i)))
    recs, lost = r.read()
    assert [x[1] for x in recs] == [0, 1, 2, 3, 4] and lost == 0
    for i in range(5, 25):
        w.put(STEP, probe_step(i, float(i)))
    recs, lost = r.read()
    assert [x[1] for x in recs] == list(range(17, 25)) and lost == 12
    w.put_device(24, None, 0.5, None)
    (rec,), _ = r.read()
    assert rec[0] == DEVICE and as_device(rec) == (24, (None, 0.5, None))


def test_the_relay_keeps_rows_the_store_refuses_and_says_what_it_lost(tmp_path):
    store = Store(tmp_path / "s.db")
    run_id = store.create_run("r", ATTACHED, {})
    relay = Relay(store.path, run_id)
    relay.store = Store(store.path)
    w = RingWriter(relay.folder, 0, 0.0, 0.0)
    for i in range(50):
        w.put(STEP, probe_step(i, float(i)))
        if i % 10 == 9:  # an epoch's end: its event beside the steps
            w.event(float(i), "epoch", f"epoch {i // 10}", {"epoch": i // 10})
    lock = sqlite3.connect(store.path, timeout=30, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    relay.store.db.conn().execute("PRAGMA busy_timeout = 0")
    relay.cycle()
    assert relay.failing and len(relay.held) == 50 and len(relay.events) == 5
    assert w.consumed() == 0
    lock.execute("COMMIT")
    w.event(50.0, "epoch", "epoch 5", {"epoch": 5})  # one more, read with the held ones
    relay.cycle()
    assert not relay.held and not relay.events and w.consumed() == 50
    assert store.steps(run_id)["step"].tolist() == list(range(50))
    # the events of a refused write are written once, in order, with the later one
    assert store.events(run_id, kinds=("epoch",))["label"].tolist() == [
        f"epoch {e}" for e in range(6)]
    assert "no step lost" in store.events(run_id, kinds=("probe",))["label"].iloc[-1]
    relay.stop()


def test_an_event_the_ring_refuses_goes_to_the_store(tmp_path, monkeypatch):
    from monitor.probe.timing import Probe

    store = Store(tmp_path / "s.db")
    run_id = store.create_run("r", ATTACHED, {})
    probe = Probe(store, run_id)
    probe.ring = RingWriter(str(tmp_path), 0, 0.0, 0.0)

    def broken(*a, **k):
        raise OSError("no room")

    monkeypatch.setattr(probe.ring, "event", broken)
    probe.event("probe", "still told", None)
    assert store.events(run_id, kinds=("probe",))["label"].tolist() == ["still told"]


WRITE_AND_DIE = """
import os, signal, sys
from monitor.ring import STEP, RingWriter
from tests.helpers import probe_step
w = RingWriter(sys.argv[1], 0, 0.0, 0.0)
for i in range(500):
    w.put(STEP, probe_step(i, float(i)))
print(os.path.exists(w.path), flush=True)  # a ring file beside the events?
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd on this system")
def test_a_ring_in_memory_reaches_the_relay_even_from_a_script_killed_before_it_read(
        tmp_path):
    """NOTE [the ring's pages]: under a started relay the ring is memory, no file; its
    descriptor waits in the relay's socket, so a script SIGKILLed before the relay's first
    read still has every step stored."""
    store = Store(tmp_path / "s.db")
    run_id = store.create_run("r", ATTACHED, {})
    relay = Relay(store.path, run_id)
    relay._loop.stop_event.set()  # ends at once: stop() makes the one read, after the death
    relay.start()
    r = subprocess.run([sys.executable, "-c", WRITE_AND_DIE, relay.folder], env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL and r.stdout.strip() == "False", r.stderr
    assert not [n for n in os.listdir(relay.folder) if n.endswith(SUFFIX)]
    assert relay.stop() == 0
    assert store.steps(run_id)["step"].tolist() == list(range(500))
    assert not os.path.exists(relay.folder)


FILE_TOO_BIG = """
import os, resource, signal, sys
from monitor.ring import RingWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    RingWriter(sys.argv[1], 0, 0.0, 0.0)
except OSError as exc:
    print("refused:", exc.strerror, sorted(os.listdir(sys.argv[1])))
"""


def test_a_ring_file_the_filesystem_cannot_hold_is_refused_when_made(tmp_path):
    """Without the relay's socket the ring is a file, its blocks reserved when it is made: a
    filesystem that cannot hold it (here a 1 MB file size limit) refuses it then, and leaves
    no file, rather than a later page killing the loop with SIGBUS (the probe then writes
    from its own thread: monitor/probe/writer.py relay_ring)."""
    r = subprocess.run([sys.executable, "-c", FILE_TOO_BIG, str(tmp_path)], env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("refused: "), (r.stdout, r.stderr)
    assert r.stdout.rstrip().endswith("[]")


FILL = """
import sys
from monitor.ring import STEP, RingWriter
from tests.helpers import probe_step
try:
    w = RingWriter(sys.argv[1], 0, 0.0, 0.0)
except OSError as exc:
    print("refused:", exc.strerror)
    sys.exit(0)
for i in range(20_000):  # 2.2 MB of records: past the 1 MB the filesystem has
    w.put(STEP, probe_step(i, float(i)))
print("wrote all")
"""


def test_a_full_filesystem_under_the_ring_never_kills_the_loop(tmp_path):
    """The ring as a file on a filesystem with less room than the ring (a 1 MB tmpfs in a
    mount namespace): refused when made. A sparse file, as the ring was until this test,
    took the loop down with SIGBUS at the first page past the room (exit -7)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to mount a small filesystem")
    small, script = tmp_path / "small", tmp_path / "fill.py"
    small.mkdir()
    script.write_text(FILL)
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {small}"
                        f" && exec {sys.executable} {script} {small}"], env=ENV,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and "mount" in r.stderr:
        pytest.skip(f"no mount namespace here: {r.stderr.strip()}")
    assert r.returncode == 0 and r.stdout.strip() == "refused: No space left on device", \
        (r.returncode, r.stdout, r.stderr)


def test_a_ring_that_cannot_be_memory_is_a_file_the_relay_reads(tmp_path, monkeypatch):
    """No memfd to be had (here the open-files limit, as memfd_create meets it): the ring is
    a file in the relay's folder, and its steps are stored all the same."""
    import monitor.ring as ring

    def no_fd(*a, **k):
        raise OSError(24, "Too many open files")

    store = Store(tmp_path / "s.db")
    run_id = store.create_run("r", ATTACHED, {})
    relay = Relay(store.path, run_id)
    relay._loop.stop_event.set()  # one read, stop()'s
    relay.start()
    monkeypatch.setattr(ring.os, "memfd_create", no_fd, raising=False)
    w = RingWriter(relay.folder, 0, 0.0, 0.0)
    assert os.path.exists(w.path)
    for i in range(40):
        w.put(STEP, probe_step(i, float(i)))
    assert relay.stop() == 0
    assert store.steps(run_id)["step"].tolist() == list(range(40))
