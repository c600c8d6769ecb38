"""A watched epoch while another connection holds the store's write lock: its steps must not
wait on it (the watchdog's thread writes them). Prints `looped N` once the loop has run while
the lock is held, then `stored N` once the steps arrived after the lock was let go."""
import os
import sqlite3
import sys
import time

from monitor import watch
from monitor.store import Store


class Trivial:
    def __init__(self, n: int) -> None:
        self.n = n
        self.num_workers, self.batch_size, self.pin_memory = 0, 1, False

    def __iter__(self):
        return iter(range(self.n))


db = os.environ["STARVATION_MONITOR_DB"]
for _ in watch(Trivial(10)):  # the run and its schema exist
    pass
store, deadline = Store(db), time.monotonic() + 60
while len(store.steps(1)) < 10 and time.monotonic() < deadline:
    time.sleep(0.05)  # sleep-ok: polling the store with a deadline (the writer's thread)
n = int(sys.argv[1])
lock = sqlite3.connect(db, timeout=0, isolation_level=None)
lock.execute("BEGIN EXCLUSIVE")  # another writer holds the store, from before the epoch
for _ in watch(Trivial(n)):  # its start (events, control) and its steps: none may wait
    pass
print(f"looped {n}", flush=True)
sys.stdin.readline()  # the test says when to let go
lock.execute("COMMIT")
lock.close()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    got = len(store.steps(1))
    if got >= n + 10:
        break
    time.sleep(0.1)  # sleep-ok: polling the store with a deadline
print(f"stored {got}", flush=True)
