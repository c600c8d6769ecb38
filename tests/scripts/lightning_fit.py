"""An unmodified PyTorch Lightning script: a LightningModule with a train and a val loader,
Trainer defaults (a sanity check of 2 validation batches first). Loading costs CPU per
sample (--work), so workers help on an idle core. Prints each training epoch's samples/s."""
from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 16, 16, generator=g)
        for _ in range(self.work):  # decoding and augmentation stand-in
            x = torch.tanh(x * 1.01 + 0.01)
        return x, i % 10


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Reloaded(Model):
    """The training loader from the module's own hook, which the Trainer calls again each
    epoch under reload_dataloaders_every_n_epochs=1 (--reload)."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def train_dataloader(self):
        return self.make()


class EpochRate(L.Callback):
    def __init__(self, hold: str | None = None) -> None:
        self.hold = hold  # a file each rank waits for after epoch 0 (a test's request first)

    def on_train_epoch_start(self, trainer, module) -> None:
        self.t0, self.n = time.perf_counter(), 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.n += len(batch[0])

    def on_train_epoch_end(self, trainer, module) -> None:
        rate = self.n / (time.perf_counter() - self.t0)
        workers = getattr(trainer.train_dataloader, "num_workers", "?")
        print(f"rank {trainer.global_rank} epoch {trainer.current_epoch}: {self.n} samples, "
              f"{rate:.1f} samples/s, num_workers={workers}", flush=True)
        if self.hold and trainer.current_epoch == 0:
            deadline = time.monotonic() + 120
            while not os.path.exists(self.hold) and time.monotonic() < deadline:
                time.sleep(0.02)  # sleep-ok: polling for the test's signal, with a deadline


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--val-batch-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--work", type=int, default=20)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--no-val", action="store_true")
    p.add_argument("--reload", action="store_true",
                   help="the training loader from the module, built again each epoch")
    p.add_argument("--hold-after-epoch0", default=None, metavar="FILE",
                   help="each rank waits for FILE to exist after its first epoch")
    a = p.parse_args()
    torch.set_num_threads(1)
    data = Images(a.samples, a.work)

    def make() -> DataLoader:
        return DataLoader(data, batch_size=a.batch_size, shuffle=True,
                          num_workers=a.num_workers,
                          persistent_workers=a.persistent_workers and a.num_workers > 0)
    val = None if a.no_val else DataLoader(Images(a.samples // 4, a.work),
                                           batch_size=a.val_batch_size)
    trainer = L.Trainer(max_epochs=a.epochs, accelerator="cpu", devices=a.devices,
                        strategy="ddp" if a.devices > 1 else "auto", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[EpochRate(a.hold_after_epoch0)],
                        reload_dataloaders_every_n_epochs=int(a.reload))
    if a.reload:
        trainer.fit(Reloaded(make), val_dataloaders=val)
    else:
        trainer.fit(Model(), make(), val)


if __name__ == "__main__":
    main()
