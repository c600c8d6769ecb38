"""A loop that breaks mid-epoch, an iterator made and let go unused (as Ultralytics makes
one), then a whole epoch: after the break the workers must be gone at once, as bare.
`--persistent`: instead, two epochs of a loader that keeps its workers (persistent_workers),
made in a function: its workers must be gone once the function returned, as bare."""
import multiprocessing
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((8,), float(i))


def persistent_epochs() -> int:
    loader = DataLoader(Items(), batch_size=4, num_workers=2, persistent_workers=True)
    return sum(1 for _ in range(2) for _ in loader)


if __name__ == "__main__" and sys.argv[1:] == ["--persistent"]:
    print(f"two epochs: {persistent_epochs()} batches", flush=True)
    print(f"workers after the loader went: {len(multiprocessing.active_children())}",
          flush=True)
elif __name__ == "__main__":
    loader = DataLoader(Items(), batch_size=4, num_workers=2)
    for i, _batch in enumerate(loader):
        time.sleep(0.005)  # sleep-ok: the step's modelled work
        if i == 5:
            break
    print(f"workers after the break: {len(multiprocessing.active_children())}", flush=True)
    unused = iter(loader)
    del unused
    print(f"workers after an unused iterator: {len(multiprocessing.active_children())}",
          flush=True)
    steps = sum(1 for _ in loader)
    print(f"whole epoch: {steps} batches", flush=True)
