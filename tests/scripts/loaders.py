"""A user's script over the loaders real training scripts use, with no monitor imports:
`python loaders.py KIND [--workers N] [--epochs E]`. Each epoch prints its batches, samples
and a checksum of what the loop received, so a test compares a monitored run's output with
a bare one's. 48 samples of batch 8: 6 batches an epoch (KIND combined: the longer of its
two loaders, 6 batches of 8 beside 3 of 4, cycled).

KINDs: multi_epochs (timm's MultiEpochsDataLoader: one iterator made in __init__ for every
epoch; multi_epochs_lazy: made at the first batch, as timm 1.0.31 does), inner_iter (a
DataLoader subclass whose __iter__ yields from super().__iter__()),
stateful (torchdata's StatefulDataLoader), webloader (webdataset's WebLoader over tar
shards, with a main-process stage after the DataLoader), hf_map and hf_stream (Hugging Face
`datasets`, map-style and a streaming IterableDataset of 2 shards), combined (Lightning's
CombinedLoader of two training loaders under Trainer.fit), boxes (Ultralytics' collate: a
dict whose first value, `batch_idx`, has one entry per box, 1-3 boxes an image), graphs
(a graph batch object with `num_graphs`, as PyG's `Batch`: its tensors count nodes),
eval_pass (each epoch trains, then evaluates over the same loader under torch.no_grad(),
as PyG's mutag_gin.py calls `test(train_loader)`, then in eval mode with gradients on, over
the same loader and over a new one of the same dataset), train_in_step (model.train() in
the step, after an evaluation of its own that leaves the model in eval mode)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset

N, BATCH = 48, 8


class Numbers(Dataset):
    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(0.001)  # sleep-ok: the workload's modelled work
        return torch.full((4,), float(i)), i


class Boxes(Numbers):
    def __getitem__(self, i: int):
        k = 1 + i % 3
        return {"img": torch.full((3, 4, 4), float(i)), "cls": torch.zeros(k, 1),
                "bboxes": torch.rand(k, 4), "im_id": i}


def collate_boxes(items):
    """Ultralytics' shape: the per-box index first, then images, classes and boxes."""
    return {"batch_idx": torch.cat([torch.full((len(x["cls"]),), float(j))
                                    for j, x in enumerate(items)]),
            "img": torch.stack([x["img"] for x in items]),
            "cls": torch.cat([x["cls"] for x in items]),
            "bboxes": torch.cat([x["bboxes"] for x in items]),
            "im_id": torch.tensor([x["im_id"] for x in items])}


class GraphBatch:
    """A batch of graphs as PyG's `Batch`: node features of every graph together (5 nodes
    a graph), one label a graph."""

    def __init__(self, ids: list[int]) -> None:
        self.x = torch.cat([torch.full((5, 4), float(i)) for i in ids])
        self.y = torch.tensor(ids)
        self.num_graphs = len(ids)


def collate_graphs(items):
    return GraphBatch([i for _, i in items])


class _RepeatSampler:
    """Repeats a sampler forever (timm.data.loader)."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class MultiEpochsDataLoader(DataLoader):
    """timm.data.loader.MultiEpochsDataLoader, as timm writes it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._DataLoader__initialized = False
        if self.batch_sampler is None:
            self.sampler = _RepeatSampler(self.sampler)
        else:
            self.batch_sampler = _RepeatSampler(self.batch_sampler)
        self._DataLoader__initialized = True
        self.iterator = super().__iter__()

    def __len__(self) -> int:
        return len(self.sampler) if self.batch_sampler is None else \
            len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


class LazyMultiEpochsDataLoader(MultiEpochsDataLoader):
    """timm 1.0.31's version: the one iterator is made at the first batch, not in __init__."""

    def __init__(self, *args, **kwargs) -> None:
        DataLoader.__init__(self, *args, **kwargs)
        self._DataLoader__initialized = False
        self.batch_sampler = _RepeatSampler(self.batch_sampler)
        self._DataLoader__initialized = True
        self.iterator = None

    def __iter__(self):
        if self.iterator is None:
            self.iterator = DataLoader.__iter__(self)
        for _ in range(len(self)):
            yield next(self.iterator)


class InnerIter(DataLoader):
    """A subclass that post-processes each batch of the base iterator."""

    def __iter__(self):
        for x, y in super().__iter__():
            yield x * 1.0, y


def webloader(workers: int, folder: str):
    import webdataset as wds

    for shard in range(2):
        with wds.TarWriter(os.path.join(folder, f"shard-{shard}.tar")) as sink:
            for i in range(shard * N // 2, (shard + 1) * N // 2):
                sink.write({"__key__": f"{i:05d}", "x.pyd": torch.full((4,), float(i)),
                            "cls": i})
    urls = os.path.join(folder, "shard-{0..1}.tar")
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode() \
        .to_tuple("x.pyd", "cls").batched(BATCH)
    # the stage after the DataLoader runs in the main process, inside the loop's wait
    return wds.WebLoader(ds, batch_size=None, num_workers=workers).map(
        lambda b: (b[0] + 0.0, b[1]))


def hf(workers: int, streaming: bool):
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict({"x": [[float(i)] * 4 for i in range(N)],
                                     "y": list(range(N))}).with_format("torch")
    if streaming:
        ds = ds.to_iterable_dataset(num_shards=2)
    return DataLoader(ds, batch_size=BATCH, num_workers=workers)


def pairs(batch):
    """(x, y) of a batch however the loader shapes it."""
    if isinstance(batch, GraphBatch):
        return batch.x, batch.y
    if isinstance(batch, dict) and "img" in batch:
        return batch["img"], batch["im_id"]
    if isinstance(batch, dict):
        return batch["x"], batch["y"]
    return batch[0], batch[1]


def plain(kind: str, workers: int, epochs: int) -> None:
    folder = tempfile.mkdtemp()
    if kind == "multi_epochs":
        loader = MultiEpochsDataLoader(Numbers(), batch_size=BATCH, num_workers=workers)
    elif kind == "multi_epochs_lazy":
        loader = LazyMultiEpochsDataLoader(Numbers(), batch_size=BATCH, num_workers=workers)
    elif kind == "inner_iter":
        loader = InnerIter(Numbers(), batch_size=BATCH, num_workers=workers)
    elif kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(Numbers(), batch_size=BATCH, num_workers=workers)
    elif kind == "webloader":
        loader = webloader(workers, folder)
    elif kind in ("hf_map", "hf_stream"):
        loader = hf(workers, kind == "hf_stream")
    elif kind == "boxes":
        loader = DataLoader(Boxes(), batch_size=BATCH, num_workers=workers,
                            collate_fn=collate_boxes)
    elif kind == "graphs":
        loader = DataLoader(Numbers(), batch_size=BATCH, num_workers=workers,
                            collate_fn=collate_graphs)
    elif kind in ("eval_pass", "train_in_step"):
        return eval_pass(workers, epochs, in_step=kind == "train_in_step")
    else:
        sys.exit(f"unknown kind {kind!r}")
    for epoch in range(epochs):
        batches = samples = total = 0
        for batch in loader:
            x, y = pairs(batch)
            time.sleep(0.005)  # sleep-ok: the "step"
            batches, samples, total = batches + 1, samples + len(y), total + int(y.sum())
        print(f"epoch {epoch}: {batches} batches, {samples} samples, checksum {total}",
              flush=True)


def eval_pass(workers: int, epochs: int, in_step: bool = False) -> None:
    """Train an epoch, then evaluate on the same loader with gradients off; then again in
    eval mode with gradients on (model.eval() without no_grad, a common omission), and over
    a new loader of the same dataset the same way (a train-accuracy loader). `in_step`: the
    step puts the model in training mode (as the HF Trainer's training_step does), after
    an evaluation under no_grad over a loader of its own that leaves it in eval mode."""
    data = Numbers()
    loader = DataLoader(data, batch_size=BATCH, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Dropout(0.1))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    for epoch in range(epochs):
        if not in_step:
            model.train()
        batches = samples = total = 0
        for x, y in loader:
            if in_step:
                model.train()
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.005)  # sleep-ok: the rest of the "step"
            batches, samples, total = batches + 1, samples + len(y), total + int(y.sum())
        if in_step:
            model.eval()
            with torch.no_grad():
                seen = sum(len(model(x)) for x, _ in DataLoader(Numbers(16), batch_size=4))
            print(f"epoch {epoch}: {batches} batches, {samples} samples, checksum {total} "
                  f"(evaluated {seen})", flush=True)
            continue
        with torch.no_grad():
            seen = sum(len(model(x)) for x, _ in loader)
        model.eval()
        seen += sum(len(model(x)) for x, _ in loader)
        seen += sum(len(model(x)) for x, _ in DataLoader(data, batch_size=16))
        print(f"epoch {epoch}: {batches} batches, {samples} samples, checksum {total} "
              f"(evaluated {seen})", flush=True)


def combined(workers: int, epochs: int) -> None:
    import lightning as L
    from lightning.pytorch.utilities import CombinedLoader
    from torch import nn

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)
            self.total = self.batches = 0

        def training_step(self, batch, _):
            (xa, ya), (xb, yb) = batch
            time.sleep(0.005)  # sleep-ok: the workload's modelled work
            self.batches += 1
            self.total += int(ya.sum()) + int(yb.sum())
            return self.net(xa).mean() + self.net(xb).mean()

        def on_train_epoch_end(self) -> None:
            print(f"epoch {self.current_epoch}: {self.batches} batches, checksum "
                  f"{self.total}", flush=True)
            self.batches = 0

        def train_dataloader(self):
            return CombinedLoader([
                DataLoader(Numbers(), batch_size=BATCH, num_workers=workers),
                DataLoader(Numbers(N // 4), batch_size=BATCH // 2, num_workers=workers)],
                mode="max_size_cycle")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
              enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False).fit(Model())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    if a.kind == "combined":
        combined(a.workers, a.epochs)
    else:
        plain(a.kind, a.workers, a.epochs)


if __name__ == "__main__":
    main()
