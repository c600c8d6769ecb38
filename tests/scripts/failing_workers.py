"""A loader whose workers fail to import what the dataset needs (PyG's NeighborLoader
without pyg-lib): every worker raises ModuleNotFoundError at its first sample, and the
error reaches the loop as torch raises it. No monitor imports."""
import torch
from torch.utils.data import DataLoader, Dataset


class NeedsPygLib(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import pyg_lib_not_installed  # noqa: F401  (absent: the worker raises)
        return torch.zeros(4)


for _batch in DataLoader(NeedsPygLib(), batch_size=8, num_workers=2):
    pass
