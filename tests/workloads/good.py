"""A user's map-style dataset with real transforms, plus a dict factory with collate_fn,
model_step and loader defaults."""
import time

import torch
from torch.utils.data import Dataset


class Squares(Dataset):
    def __init__(self, n=2048, cost_s=0.0005):
        self.n, self.cost_s = n, cost_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        t = time.perf_counter()
        x = torch.full((3, 16, 16), float(i))
        while time.perf_counter() - t < self.cost_s:  # real CPU work per sample
            x = torch.tanh(x * 0.5 + 0.1)
        return x, i % 10


def make():
    return Squares()


def make_dict():
    def collate(batch):
        xs, ys = zip(*batch, strict=True)
        return torch.stack(xs), torch.tensor(ys)

    def step(batch):
        x, y = batch
        time.sleep(0.01)  # sleep-ok: the workload's modelled work
        return float(x.mean())

    return {"dataset": Squares(), "collate_fn": collate, "model_step": step,
            "batch_size": 16, "num_workers": 1}
