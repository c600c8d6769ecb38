"""A user's script whose loader waits on "storage" (4 ms per sample) beside a tiny model:
more DataLoader workers pay, the kind of job the live autotune is for."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Remote(Dataset):
    def __len__(self):
        return ARGS.samples

    def __getitem__(self, i):
        time.sleep(0.004)  # sleep-ok: the modelled storage latency
        return torch.randn(16), i


ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=8)
ap.add_argument("--samples", type=int, default=320)
ap.add_argument("--num-workers", type=int, default=0)
ap.add_argument("--shuffle", action="store_true")
ARGS = ap.parse_args()

if __name__ == "__main__":
    torch.set_num_threads(1)
    model, loss = nn.Linear(16, 2), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Remote(), batch_size=16, num_workers=ARGS.num_workers,
                        shuffle=ARGS.shuffle)
    for epoch in range(ARGS.epochs):
        t, n, seen = time.perf_counter(), 0, []
        for x, i in loader:
            opt.zero_grad()
            loss(model(x), i % 2).backward()
            opt.step()
            n += len(x)
            seen += i.tolist()
        # a change mid-epoch must neither repeat nor drop a sample
        once = sorted(seen) == list(range(ARGS.samples))
        print(f"epoch {epoch}: every sample once: {once}", flush=True)
        print(f"epoch {epoch}: order {hash(tuple(seen)) % 10**8}", flush=True)
        print(f"epoch {epoch}: {n / (time.perf_counter() - t):.0f} samples/s "
              f"(num_workers={loader.num_workers})", flush=True)
