"""A plain loop that builds its training DataLoader inside the epoch loop (a new loader over
the same dataset each epoch, persistent_workers as given), and evaluates over the training
data with gradients off. Prints each epoch's samples and the workers its loader ran with.
`python built_each_epoch.py [EPOCHS [PAUSE_S [WORKERS]]]`: epochs (3), a pause after the
first (room for a test to request a change), the workers the script asks for (0)."""
import sys
import time

import torch
from torch.utils.data import DataLoader
from two_epochs import Slow  # (this folder: 96 samples of 4 ms)


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    data = Slow()
    model = torch.nn.Linear(4, 1)
    for epoch in range(epochs):
        train = DataLoader(data, batch_size=8, shuffle=True, num_workers=workers,
                           persistent_workers=workers > 0)
        n = 0
        for x, _y in train:
            model(x).sum().backward()
            time.sleep(0.01)  # sleep-ok: the modelled step
            n += len(x)
        with torch.no_grad():  # evaluation over the training data: not training
            for x, _y in DataLoader(data, batch_size=32):
                model(x)
        print(f"epoch {epoch} done: {n} samples, num_workers={train.num_workers}", flush=True)
        if epoch == 0:
            time.sleep(pause)  # sleep-ok: room for the test to request a change
        del train


if __name__ == "__main__":
    main()
