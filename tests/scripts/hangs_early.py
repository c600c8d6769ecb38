"""A user's script whose dataset serves a few samples per loading process, then blocks forever
(a deadlock taken at fork, a hung mount): a hang in the first batches, with no history."""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class HangsEarly(Dataset):
    def __init__(self):
        self.served = 0

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        self.served += 1
        if self.served > 16:
            while True:
                time.sleep(3600)  # sleep-ok: the hang is the scenario
        return torch.zeros(4), 0


if __name__ == "__main__":
    loader = DataLoader(HangsEarly(), batch_size=8, num_workers=int(sys.argv[1]))
    for step, _ in enumerate(loader):
        print(f"step {step}", flush=True)
