"""How many samples a batch holds: the leading dimension of its first tensor (batch_len, the
per-step fast path), or a counter chosen once from a run's first batch (sample_counter: a
mapping by its input, a graph batch by num_graphs, a list of samples by its length).
Standard library only (the probe's fence): batches are read by their attributes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _tensorish(x: Any) -> bool:
    return hasattr(x, "shape") or (isinstance(x, (list, tuple)) and bool(x)
                                   and hasattr(x[0], "shape"))


def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor-like item. A first
    item that is a list of batches (Lightning's CombinedLoader yields `([(x, y), (x2, y2)],
    index, loader_index)`) is looked into; a list of plain values counts by its length.
    Once a step: the common kinds first, without a failed attribute lookup (an exception
    made and dropped inside getattr)."""
    kind = type(batch)
    if kind is tuple or kind is list:  # (inputs, targets): its first item's leading dim
        shape = getattr(batch[0], "shape", None) if batch else None
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    elif kind is int:  # one plain sample (batch_size=None)
        return 1
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:  # a tensor: the common case, first
        return int(shape[0])
    if isinstance(batch, (int, float, str, bytes)):  # one plain sample (batch_size=None)
        return 1
    item = batch
    if isinstance(item, dict) and item:
        item = next(iter(item.values()))
    elif isinstance(item, (list, tuple)) and item:
        item = item[0]
    for _ in range(3):
        if hasattr(item, "shape") or not (isinstance(item, (list, tuple)) and item
                                          and _tensorish(item[0])):
            break
        item = item[0]
    shape = getattr(item, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(item) if hasattr(item, "__len__") else 1


# A mapping's input, by the names frameworks give it (Ultralytics `img`, HF `pixel_values` /
# `input_ids`, torchvision-style `image`): its leading dimension is the batch's samples.
INPUT_KEYS = ("img", "image", "images", "pixel_values", "input_ids", "input", "inputs",
              "input_values", "input_features", "x", "data", "features", "video", "audio")


def _lead(x: Any) -> int | None:
    """A value's leading dimension: a tensor's shape[0], a list's or tuple's length."""
    shape = getattr(x, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) > 0 else None
    return len(x) if isinstance(x, (list, tuple)) else None


def sample_counter(batch: Any, expected: int | None = None
                   ) -> tuple[Callable[[Any], int], str]:
    """How to count a batch's samples, chosen once from the first batch, and its words (the
    run's `samples_from`). A mapping counts by its input's leading dimension (a named
    input, else the leading dimension most of its values share, tensors and per-sample
    lists alike), never by its first value's: Ultralytics' collate puts `batch_idx`, one
    entry per box, first (942 "samples" for 512 images). A graph batch (PyG `Batch`)
    counts its graphs. A list of `expected` samples (the loader's batch size: a
    torchdata.nodes Batcher yields its samples uncollated) counts by its length.
    Everything else: batch_len."""
    if isinstance(batch, list) and expected and expected > 1 and len(batch) == expected \
            and _lead(batch[0]) != expected:
        return len, "the length of the list of samples"
    if isinstance(batch, dict) and batch:
        key = next((k for k in INPUT_KEYS if k in batch and _lead(batch[k])), None)
        if key is None:
            # (key, leading dim, dims): the dimension most values share, ties to the one an
            # image-like tensor has (boxes come as (n, 4) and (n,), images as (b, c, h, w))
            leads = [(k, n, len(getattr(v, "shape", ()))) for k, v in batch.items()
                     if (n := _lead(v))]
            score: dict[int, tuple[int, int]] = {}
            for _, n, dims in leads:
                shared, most = score.get(n, (0, 0))
                score[n] = (shared + 1, max(most, dims))
            if score:
                best = max(score, key=lambda n: score[n])
                key = max((x for x in leads if x[1] == best), key=lambda x: x[2])[0]
        if key is not None:
            def by_key(b: Any, key: Any = key) -> int:
                n = _lead(b.get(key)) if isinstance(b, dict) else None
                return n if n is not None else batch_len(b)
            return by_key, f"the leading dimension of batch[{key!r}]"
    graphs = getattr(batch, "num_graphs", None)
    if isinstance(graphs, int) and not isinstance(batch, (list, tuple, dict)):
        def by_graphs(b: Any) -> int:
            n = getattr(b, "num_graphs", None)
            return n if isinstance(n, int) else batch_len(b)
        return by_graphs, f"{type(batch).__name__}.num_graphs"
    return batch_len, "the leading dimension of the batch's first tensor"
