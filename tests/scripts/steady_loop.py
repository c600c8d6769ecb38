"""A steady user loop for the page-watching tests: SECONDS of epochs, a loader that takes
about 6 ms a batch and a 12 ms step (starving, the same every window); with a second
argument, a file whose appearance ends the loop sooner (a test's "now end"); STEADY_WORKERS
in the environment: the loader's num_workers (default 0)."""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Sleepy(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.00075)  # sleep-ok: the workload's modelled work
        return torch.zeros(4)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    stop = sys.argv[2] if len(sys.argv) > 2 else None
    loader = DataLoader(Sleepy(), batch_size=8,
                        num_workers=int(os.environ.get("STEADY_WORKERS", "0")))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in loader:
            time.sleep(0.012)  # sleep-ok: the workload's modelled work
            if time.monotonic() >= end or (stop and os.path.exists(stop)):
                end = time.monotonic()
                break


if __name__ == "__main__":
    main()
