"""The one background loop (monitor/periodic.py): its schedule keeps to start + k * period
whatever a tick costs, a late tick is followed by one at once and never by a burst, and a
loop stops, ends, fails and restarts as its owners rely on."""
from __future__ import annotations

import threading

from monitor.periodic import Periodic
from tests.conftest import wait_for


class Waits:
    """A stop Event whose waits are recorded and return at once: the schedule's arithmetic
    without real time (True, i.e. stopped, after `n` waits)."""

    def __init__(self, clock: list[float], n: int) -> None:
        self.clock, self.n, self.waits = clock, n, []

    def wait(self, timeout: float) -> bool:
        self.waits.append(round(timeout, 6))
        self.clock[0] += timeout  # the wait took its time
        return len(self.waits) > self.n

    def is_set(self) -> bool:
        return False


def test_the_schedule_does_not_drift_and_never_bursts():
    now = [100.0]
    costs = iter([0.3, 0.3, 2.5, 0.3, 0.3])  # the third tick runs 1.5 s past its period

    def tick() -> None:
        now[0] += next(costs)

    p = Periodic("t", tick, 1.0, clock=lambda: now[0])
    p.stop_event = Waits(now, 5)  # type: ignore[assignment]
    p._loop()
    # each wait makes up what the tick took; after the late one, the next tick comes at
    # once (a wait of 0) and the schedule runs on from there: no catch-up burst
    assert p.stop_event.waits == [1.0, 0.7, 0.7, 0.0, 0.7, 0.7]


def test_a_loop_ticks_on_its_thread_stops_and_starts_again():
    ticks: list[str] = []
    p = Periodic("starvation-test", lambda: ticks.append(threading.current_thread().name),
                 0.01, at_once=True)
    assert p.start() is p and wait_for(lambda: len(ticks) >= 3, timeout=30)
    assert set(ticks) == {"starvation-test"} and p.thread.daemon
    assert p.stop(10) and not p.alive and p.stopping
    n = len(ticks)
    p.start()  # a new thread, the stop cleared
    assert wait_for(lambda: len(ticks) > n, timeout=30) and p.alive
    assert p.stop(10)


def test_the_hooks_end_fail_and_wake_as_their_owners_need():
    finished: list[str] = []
    # tick returning False ends the loop; finish runs on the thread however it ended
    count = iter(range(10))
    p = Periodic("a", lambda: next(count) < 2, 0.001, finish=lambda: finished.append("a"))
    p.start()
    assert wait_for(lambda: not p.alive, timeout=30) and finished == ["a"]
    assert next(count) == 3  # ticks 0, 1 went on; tick 2 ended it
    # an exception goes to on_error, and the loop ends
    errors: list[BaseException] = []
    q = Periodic("b", lambda: 1 / 0, 0.001, on_error=errors.append,
                 finish=lambda: finished.append("b"))
    q.start()
    assert wait_for(lambda: not q.alive, timeout=30)
    assert isinstance(errors[0], ZeroDivisionError) and finished == ["a", "b"]
    # before() returning False: no tick at all; stop() wakes a thread asleep elsewhere
    gate = threading.Event()
    ticked: list[int] = []
    r = Periodic("c", lambda: ticked.append(1), 0.001, before=lambda: not gate.wait(),
                 wake=gate.set)
    r.start()
    assert r.stop(10) and not ticked
    # a stop set before the first start stands: the thread ends without a tick
    s = Periodic("d", lambda: ticked.append(1), 0.001)
    s.stop_event.set()
    s.start()
    assert wait_for(lambda: not s.alive, timeout=30) and not ticked
