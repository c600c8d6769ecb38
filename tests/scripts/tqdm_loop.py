"""A loop under a live tqdm bar (as the HF Trainer draws one): the bar's `\\r` line is
unfinished on stderr when the probe first speaks."""
import torch
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8)
with tqdm(total=8, file=__import__("sys").stderr, mininterval=0, ascii=True) as bar:
    bar.update(0)
    for (_x,) in loader:
        bar.update(1)
