import torch
from torch.utils.data import IterableDataset, get_worker_info


class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        start = info.id if info else 0
        step = info.num_workers if info else 1
        for i in range(start, 100000, step):
            yield torch.randn(8), i % 10


def make():
    return Stream()
