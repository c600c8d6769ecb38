"""A user's plain training loop, run with one of the probe's own entry points broken:
`python probe_fault.py POINT [--workers N]`. Under `monitor run` (STARVATION_MONITOR_RUN_ID
set) the named probe function is replaced by one that raises ProbeBug before the loop
starts; run bare, nothing is touched. The loop prints what it received per epoch and exits
with code 3, so a test compares the two runs' output and exit status."""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class ProbeBug(RuntimeError):
    pass


def boom(*args, **kwargs):
    raise ProbeBug("injected probe failure")


def inject(point: str) -> None:
    """Break one entry point the probe runs inside the user's process."""
    from monitor.probe import patch, recorder, timing
    from monitor.probe.device_clock import DeviceClock
    from monitor.ring import RingWriter
    from monitor.store import Store

    if point == "state":  # an impossible state: a delivered batch with no request time
        timed_next = timing.TimedIterator.__next__

        def lose_time(self):
            batch = timed_next(self)
            if self.delivered == 3:
                self._t_req = None
            return batch

        timing.TimedIterator.__next__ = lose_time
        return
    target = {
        "recorder": (patch, "recorder"),
        "loop_role": (patch, "loop_role"),
        "start_epoch": (recorder.Recorder, "start_epoch"),
        "note_workers": (recorder.Recorder, "note_workers"),
        "follow": (recorder.Recorder, "follow"),
        "record": (timing.Probe, "record"),
        "first_batch": (timing.TimedIterator, "_first"),
        "batch_arrived": (DeviceClock, "batch_arrived"),
        "batch_done": (DeviceClock, "batch_done"),
        "ring_put": (RingWriter, "put"),
        "control": (Store, "control_after"),
        "flush_final": (timing.Probe, "flush_final"),
    }[point]
    setattr(*target, boom)


class Numbers(Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        time.sleep(0.001)  # sleep-ok: the workload's modelled work
        return torch.full((2,), float(i)), i


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("point")
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args()
    if os.environ.get("STARVATION_MONITOR_RUN_ID"):
        inject(a.point)
    loader = DataLoader(Numbers(), batch_size=8, num_workers=a.workers)
    for epoch in range(2):
        seen = []
        for _x, y in loader:
            time.sleep(0.002)  # sleep-ok: the workload's modelled work
            seen += y.tolist()
        print(f"epoch {epoch}: {len(seen)} samples, checksum {sum(seen)}, "
              f"first {seen[:3]}", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
