"""A user's script whose dataset serves a few samples per loading process, then blocks forever
(a deadlock taken at fork, a hung mount): a hang in the first batches, with no history.
`hangs_early.py WORKERS validation`: a training loader of 8 batches trains an epoch, then
the validation loader's dataset hangs at its first sample (`validation_killed`: its worker is
killed there): a loader the probe does not time (NOTE [an untimed loader's stall])."""
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Dies(Dataset):
    """Its worker is killed at its first sample (as the kernel's OOM killer would)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        os.kill(os.getpid(), signal.SIGKILL)


class HangsEarly(Dataset):
    def __init__(self, serves: int = 16):  # samples served by each loading process
        self.served, self.serves = 0, serves

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        self.served += 1
        if self.served > self.serves:
            while True:
                time.sleep(3600)  # sleep-ok: the hang is the scenario
        return torch.zeros(4), 0


if __name__ == "__main__":
    workers = int(sys.argv[1])
    loader = DataLoader(HangsEarly(), batch_size=8, num_workers=workers)
    if sys.argv[2:] in (["validation"], ["validation_killed"]):
        data = torch.utils.data.TensorDataset(torch.zeros(64, 4), torch.zeros(64))
        for _ in DataLoader(data, batch_size=8, num_workers=workers):
            time.sleep(0.005)  # sleep-ok: the "step"
        print("trained an epoch, validating", flush=True)
        with torch.no_grad():
            val = HangsEarly(0) if sys.argv[2] == "validation" else Dies()
            for _ in DataLoader(val, batch_size=8, num_workers=workers):
                pass
    for step, _ in enumerate(loader):
        print(f"step {step}", flush=True)
