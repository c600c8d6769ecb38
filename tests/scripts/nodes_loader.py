"""A torchdata.nodes pipeline, unmodified (no monitor imports): a map-style dataset's
indices through a ParallelMapper of 2 process workers (4 ms of loading a sample), a
Batcher of 8, a Prefetcher of 2, and a Loader driven for 3 epochs of 6 batches with a
5 ms step. Prints each epoch's batches and samples. `python nodes_loader.py [METHOD
[WORKERS [CONTEXT [EPOCHS]]]]`: the mapper's method (process, thread), workers (2), its
multiprocessing_context (default: the platform's) and the epochs (3)."""
import sys
import time

import torch
import torchdata.nodes as tn


def load(i: int) -> torch.Tensor:
    time.sleep(0.004)  # sleep-ok: the sample's loading
    return torch.full((4,), float(i))


def main() -> None:
    node = tn.SamplerWrapper(range(48))
    method = sys.argv[1] if len(sys.argv) > 1 else "process"
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    context = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "default" else None
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    node = tn.ParallelMapper(node, map_fn=load, num_workers=workers, method=method,
                             multiprocessing_context=context)
    node = tn.Batcher(node, batch_size=8)
    node = tn.Prefetcher(node, prefetch_factor=2)
    loader = tn.Loader(node)
    for epoch in range(epochs):
        batches = samples = 0
        for batch in loader:
            time.sleep(0.005)  # sleep-ok: the modelled step
            batches, samples = batches + 1, samples + len(batch)
        print(f"epoch {epoch}: {batches} batches, {samples} samples", flush=True)


if __name__ == "__main__":
    main()
