"""The one background loop (DESIGN.md style rule 5): a named daemon thread that calls `tick`
on a drift-free monotonic schedule until `stop()`, an Event to stop it. Every background
loop of the product is one: the probe's stall watchdog, the relay, the sampler's collector,
the live tuner, the terminal view, the session manager's reaper, and the outputs that
follow a live run (monitor/assess/follow.py). Standard library only (the probe imports it).

The schedule: tick k is due at start + k * period (the period read again before each wait,
so a loop may change it); a tick that ran late is followed by the next one at once and the
schedule restarts from then, never a burst of catch-ups (a suspended or saturated host).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Periodic:
    """`tick()` every `every` seconds (or `every()`, read before each wait) on a daemon
    thread named `name`; `tick` returning False ends the loop. `at_once`: the first tick
    before the first wait. `before()`, on the thread before the loop, returning False ends it
    without a tick (the watchdog sleeps on its FIFO there). `on_error(exc)`: an exception a
    tick raised, after which the loop ends (without it the exception ends the thread, and
    threading's hook prints it). `finish()`, on the thread after the loop however it ended
    (a thread's own store connection closed). `wake()`: called by stop() after the stop is
    set, to rouse a thread that sleeps on something other than the Event."""

    def __init__(self, name: str, tick: Callable[[], Any], every: float | Callable[[], float],
                 *, at_once: bool = False, before: Callable[[], bool] | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 finish: Callable[[], None] | None = None, wake: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.tick, self.every, self.at_once = name, tick, every, at_once
        self.before, self.on_error, self.finish, self.wake = before, on_error, finish, wake
        self.clock = clock
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def period(self) -> float:
        return self.every() if callable(self.every) else self.every

    def start(self) -> Periodic:
        """Start the thread (again, after a stop, with a new one; a stop set before the
        first start stands: the thread ends at once)."""
        if self.thread is None or not self.thread.is_alive():
            if self.thread is not None:
                self.stop_event.clear()
            self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self.thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> bool:
        """Stop, and wait up to `timeout` for the thread (never for itself): True when it has
        ended."""
        self.stop_event.set()
        if self.wake is not None:
            self.wake()
        t = self.thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout)
        return t is None or not t.is_alive()

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    def _run(self) -> None:
        try:
            if self.before is None or self.before():
                self._loop()
        except BaseException as exc:
            if self.on_error is None:
                raise
            self.on_error(exc)
        finally:
            if self.finish is not None:
                self.finish()

    def _loop(self) -> None:
        if self.at_once and not self.stop_event.is_set() and self.tick() is False:
            return
        due = self.clock()
        while True:
            due += self.period()
            now = self.clock()
            if due < now:  # late: the next tick at once, the schedule from here
                due = now
            if self.stop_event.wait(max(0.0, due - now)):
                return
            if self.tick() is False:
                return
