"""An unmodified Hugging Face Trainer script: a small randomly initialised BERT classifier
(no hub download), a synthetic tokenised dataset whose samples cost CPU (--work), the
Trainer's own DataLoader (accelerate underneath: built with batch_sampler=), an eval set
evaluated each epoch. Prints each training epoch's samples/s."""
from __future__ import annotations

import argparse
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SEQ = 32


class Tokens(Dataset):
    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(64, generator=g)
        for _ in range(self.work):  # tokenising and augmentation stand-in
            x = torch.tanh(x * 1.01 + 0.01)
        ids = (x[:SEQ] * 999).long() + 1
        return {"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": torch.tensor(i % 2)}


class EpochRate(TrainerCallback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_epoch_begin(self, args, state, control, **kw):
        self.t0, self.step0 = time.perf_counter(), state.global_step

    def on_epoch_end(self, args, state, control, **kw):
        n = (state.global_step - self.step0) * self.batch
        print(f"epoch {int(round(state.epoch or 0)) - 1}: {n} samples, "
              f"{n / (time.perf_counter() - self.t0):.1f} samples/s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=320)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--work", type=int, default=100)
    p.add_argument("--persistent-workers", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                     num_labels=2)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=a.batch_size,
            per_device_eval_batch_size=2 * a.batch_size, num_train_epochs=a.epochs,
            dataloader_num_workers=a.num_workers,
            dataloader_persistent_workers=a.persistent_workers and a.num_workers > 0,
            eval_strategy="epoch", save_strategy="no",
            logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
        Trainer(model=BertForSequenceClassification(cfg), args=args,
                train_dataset=Tokens(a.samples, a.work),
                eval_dataset=Tokens(a.samples // 4, a.work),
                callbacks=[EpochRate(a.batch_size)]).train()


if __name__ == "__main__":
    main()
