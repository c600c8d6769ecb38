"""Ray Train's TorchTrainer with 2 CPU workers, unmodified (no monitor imports): each rank
trains 3 epochs of 32 batches of 8 (its half of 512 samples, DistributedSampler), a 1-worker
DataLoader prepared by Ray, with a 20 ms step. Ray runs the train function in a
`TrainingThread` of each worker process, which is not a child of this driver."""
import os
import time

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(0.001)  # sleep-ok: the sample's loading
        return torch.full((4,), float(i)), i % 2


def train_func():
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(Slow(), batch_size=8, num_workers=1, shuffle=True))
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        n = 0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.02)  # sleep-ok: the rest of the modelled step
            n += 1
        rank = ray.train.get_context().get_world_rank()
        print(f"rank {rank} epoch {epoch}: {n} batches", flush=True)  # (to the driver's log)
        ray.train.report({"epoch": epoch, "batches": n})


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)  # (no prestarted pool:
    # RAY_num_prestart_python_workers=0 in the test's environment, a busy box's CPU spared)
    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)).fit()
    print("fit done", flush=True)
