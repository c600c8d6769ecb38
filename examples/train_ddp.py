"""A real DistributedDataParallel job on the CPU (gloo), to try the monitor on several ranks:

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --epochs 3
    python -m monitor run -- torchrun --standalone --nproc-per-node 2 \\
        examples/train_ddp.py --slow-rank 1 --slow-factor 4        # rank 1 starves

Each sample costs `--sample-ms` of storage latency (a sleep, like a network read) and a
little CPU; `--slow-rank R --slow-factor F` makes rank R's samples F times slower, the input
straggler: rank R waits for data while every other rank waits for it inside the gradient
all-reduce. Nothing is downloaded.

Under Slurm without torchrun (`srun --ntasks 8 --cpus-per-task 4 python -m monitor run --
python examples/train_ddp.py`), each task is a rank: its rank and the world size come from
SLURM_PROCID and SLURM_NTASKS, the rendezvous from MASTER_ADDR and MASTER_PORT (set them in
the batch script: the first node's hostname, a free port).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Samples(Dataset):
    def __init__(self, n: int, sample_s: float) -> None:
        self.n, self.sample_s = n, sample_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.sample_s)  # sleep-ok: the modelled storage latency
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), i % 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=512, help="samples per epoch, all ranks")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--sample-ms", type=float, default=2.0)
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--slow-factor", type=float, default=4.0)
    ap.add_argument("--fail-rank", type=int, default=None, help="this rank raises in epoch 1")
    a = ap.parse_args()
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun started it
        dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]),
                                world_size=int(os.environ["SLURM_NTASKS"]))
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    slow = a.slow_factor if rank == a.slow_rank else 1.0
    data = Samples(a.samples, a.sample_ms / 1000 * slow)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=a.batch_size, sampler=sampler,
                        num_workers=a.num_workers)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(),
                                                  nn.Linear(64, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        t, n = time.perf_counter(), 0
        if epoch == 1 and rank == a.fail_rank:
            raise RuntimeError(f"rank {rank} failed on purpose")
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()  # all-reduce in here
            opt.step()
            n += len(x)
        rate = n / (time.perf_counter() - t)
        print(f"rank {rank}/{world} epoch {epoch}: {rate:.0f} samples/s "
              f"(num_workers={loader.num_workers})", flush=True)
    # every rank reaches teardown together: a rank that destroys its group while a slower
    # one is still in its last all-reduce can abort at exit in torch's gloo ("terminate
    # called without an active exception", SIGABRT: 3 of 10 bare runs of this script
    # with a slow rank beside three busy processes)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and os.environ.get("LOCAL_RANK") is not None:
        print("done", flush=True)


if __name__ == "__main__":
    main()
