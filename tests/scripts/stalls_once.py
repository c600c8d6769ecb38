"""A user's script whose dataset stalls once for a few seconds (a slow network read), then
goes on: the probe must say so and never stop it."""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class StallsOnce(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 40:
            time.sleep(float(sys.argv[1]))  # sleep-ok: the stall is the scenario
        return torch.zeros(4), 0


if __name__ == "__main__":
    n = sum(len(x) for x, _ in DataLoader(StallsOnce(), batch_size=8))
    print(f"done: {n} samples", flush=True)
