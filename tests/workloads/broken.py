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
