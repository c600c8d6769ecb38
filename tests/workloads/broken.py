"""Failure cases, one factory each."""
import torch
from torch.utils.data import Dataset


def helper_that_fails():
    raise KeyError("missing_column")


class Fails(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i >= 0:
            raise ValueError(f"corrupt record {i}")
        return torch.zeros(1)


class HoldsLambda(Dataset):
    def __init__(self):
        self.transform = lambda x: x * 2

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return self.transform(torch.ones(2))


def raises_in_factory():
    helper_that_fails()


def wrong_type():
    Fails()  # forgot to return it


def not_a_dataset():
    class Almost:
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return i
    return Almost()


def raises_in_getitem():
    return Fails()


def unpicklable():
    return {"dataset": HoldsLambda(), "multiprocessing_context": "spawn"}


NOT_CALLABLE = 42


class HangsAfter(Dataset):
    """Serves `after` samples, then sleeps forever in __getitem__ (a stuck NFS read)."""

    def __init__(self, after: int = 50):
        self.after = after
        self.served = 0

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        self.served += 1
        if self.served > self.after:
            import time

            while True:
                time.sleep(3600)  # sleep-ok: the hang is the fault under test
        return torch.zeros(3, 8, 8), 0


def hangs():
    return {"dataset": HangsAfter(), "batch_size": 8}


def hangs_at_once():
    """Hangs in its very first __getitem__: there is no first batch, no step history."""
    return {"dataset": HangsAfter(after=0), "batch_size": 8}


class KilledWorker(Dataset):
    """Its DataLoader worker is killed by SIGKILL at its 200th sample (as a scheduler's
    preemption or a `kill -9` kills it: not the OOM killer)."""

    def __init__(self):
        self.n = 0

    def __len__(self):
        return 100000

    def __getitem__(self, i):
        import os
        import signal

        self.n += 1
        if self.n == 200 and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.zeros(8)


def killed_worker():
    return KilledWorker()
