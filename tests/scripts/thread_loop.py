"""The training loop in a thread of its own while the main thread only waits for it, as Ray
Train runs the train function in its `TrainingThread` (the main thread serves Ray's tasks).
No monitor imports. Two epochs of 12 batches of 8, with backward and an optimizer step;
a validation loader after each epoch (not training)."""
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        time.sleep(0.002)  # sleep-ok: the sample's loading
        return torch.full((4,), float(i)), i % 2


def train_func():
    loader = DataLoader(Slow(), batch_size=8, num_workers=1)
    val = DataLoader(Slow(), batch_size=8)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        n = 0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
        with torch.no_grad():
            for x, _ in val:
                model(x)
        print(f"epoch {epoch}: {n} batches", flush=True)


t = threading.Thread(target=train_func, name="TrainingThread(train_func)", daemon=True)
t.start()
t.join()
