"""fastai's `Learner.fit`, unmodified (no monitor imports): a train and a valid fastai
DataLoader over 96 and 32 samples (2 ms of loading each), `bs` 8, and a small model, fit
for 2 epochs: 12 training batches an epoch. `python fastai_fit.py [WORKERS] [--callback]`
(2 workers; --callback: `monitor.fastai_callback()` in the Learner's callbacks, for a run
without `monitor run`, as in a notebook)."""
import sys
import time

import torch
from fastai.data.core import DataLoaders
from fastai.data.load import DataLoader
from fastai.learner import Learner


class Slow:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(0.002)  # sleep-ok: the sample's loading
        return torch.full((4,), float(i)), torch.tensor(i % 2)


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    cbs = []
    if "--callback" in sys.argv:
        import monitor

        cbs.append(monitor.fastai_callback())
    train = DataLoader(Slow(96), bs=8, num_workers=workers, shuffle=True)
    valid = DataLoader(Slow(32), bs=8, num_workers=0)
    learn = Learner(DataLoaders(train, valid), torch.nn.Linear(4, 2),
                    loss_func=torch.nn.CrossEntropyLoss(), cbs=cbs)
    learn.fit(2, lr=0.01)
    print("fit done", flush=True)


if __name__ == "__main__":
    main()
