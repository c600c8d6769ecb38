"""A user's script for the attach tests: two epochs, a validation loader, prints, and exits
with the code given on the command line (to check it passes through)."""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        time.sleep(0.004)  # sleep-ok: the workload's modelled work
        return torch.full((4,), float(i)), i % 2


def main():
    code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    epoch_pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    train = DataLoader(Slow(), batch_size=8, num_workers=0)
    val = DataLoader(Slow(), batch_size=32)
    for epoch in range(2):
        n = 0
        for x, _y in train:
            time.sleep(0.01)  # sleep-ok: the "step"
            n += len(x)
        for _ in val:  # not timed: only the first loader iterated is
            pass
        print(f"epoch {epoch} done: {n} samples, num_workers={train.num_workers}", flush=True)
        time.sleep(epoch_pause)  # sleep-ok: room for the test to request a change
    sys.exit(code)


if __name__ == "__main__":
    main()
