"""A plain loop for the relay's tests (tests/test_relay.py), run under `monitor run`:
`python relay_loop.py N MODE FOLDER`. One epoch of N steps over a DataLoader, then by MODE:
`normal` exits 0; `raise` raises at step N // 2; `kill` writes FOLDER/looped and waits (the
test kills it); `hold` first waits for FOLDER/go (the test has locked the store), loops,
writes FOLDER/looped, then waits for FOLDER/release before it exits; `orphan` writes
FOLDER/looped, waits for FOLDER/go (the test has killed `monitor run`), runs a second epoch
and writes FOLDER/looped2."""
import os
import sys
import time

from torch.utils.data import DataLoader


def wait_file(path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)  # sleep-ok: polling for the test's signal, with a deadline


n, mode, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if mode == "hold":
    wait_file(os.path.join(folder, "go"))
loader = DataLoader(list(range(n)), batch_size=1)


def say(name: str) -> None:
    with open(os.path.join(folder, name + ".tmp"), "w") as f:
        f.write(str(n))
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


for i, _batch in enumerate(loader):
    if mode == "raise" and i == n // 2:
        raise RuntimeError("the loop's own error")
say("looped")
if mode == "orphan":
    wait_file(os.path.join(folder, "go"))
    for _batch in loader:
        pass
    say("looped2")
if mode == "kill":
    wait_file(os.path.join(folder, "never"), timeout=600)
if mode == "hold":
    wait_file(os.path.join(folder, "release"))
