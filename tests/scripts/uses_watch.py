"""A script that uses the explicit API: for batch in watch(loader)."""
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from monitor import watch

loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8)
for _epoch in range(2):
    for (_x,) in watch(loader, name="explicit"):
        time.sleep(0.005)  # sleep-ok: the workload's modelled work
print("done", flush=True)
