"""A loader drained by a background thread into a queue (the MONAI ThreadDataLoader
pattern): the training loop reads the queue, through watch()."""
import queue
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

from monitor import watch


class Slow(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        time.sleep(0.008)  # sleep-ok: the workload's modelled work
        return torch.full((4,), float(i))


def batches(loader, depth=4):
    q: queue.Queue = queue.Queue(depth)

    def fill():
        for b in loader:
            q.put(b)
        q.put(None)

    threading.Thread(target=fill, name="prefetch", daemon=True).start()
    while (b := q.get()) is not None:
        yield b


def main():
    loader = DataLoader(Slow(), batch_size=8)
    for _epoch in range(2):
        for _ in watch(batches(loader)):
            time.sleep(0.08)  # sleep-ok: the step: slower than loading, so the queue stays full


if __name__ == "__main__":
    main()
