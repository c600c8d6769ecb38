"""What the probe sees of a DataLoader's workers and of the limits its batches meet, inside
the training process (standard library only; torch read from sys.modules).

- Which worker produced each batch, and how many finished batches were held behind it: the
  multiprocessing iterator hands each batch to its `_process_data(data, worker_idx)`, so the
  probe wraps that one bound method of the iterator it times (one call and a few reads a
  batch; nothing of torch's is patched). `held` counts batches already finished by other
  workers that the in-order queue keeps until this one arrives: a slow sample holding the
  loop (head-of-line) shows as waits with batches held.
- Once an epoch, at its first batch, the figures a batch's journey depends on: its bytes and
  tensor count, the workers and prefetch in flight, /dev/shm's size and free space (batches
  pass through it), the open-files limit and descriptors open now (torch's default
  `file_descriptor` sharing holds one per tensor in flight), the sharing strategy and the
  start method.
- The loader's own error, as it passes to the loop untouched (a worker killed by a signal,
  'received 0 items of ancdata'), so the run's reason can name the cause.
"""
from __future__ import annotations

import os
import resource
import sys
from typing import Any

MAX_WALK = 256  # items looked at when counting a batch's tensors and bytes


def hook(it: Any, probe: Any) -> bool:
    """Count per batch which worker produced it (probe.batch_worker) and the finished
    batches held behind it (probe.batch_held). False when `it` is no multiprocessing
    DataLoader iterator (0 workers, a generator, another library's loader)."""
    orig = getattr(it, "_process_data", None)
    info = getattr(it, "_task_info", None)
    if orig is None or not isinstance(info, dict) or getattr(orig, "_starvation_hook", False):
        return False

    def _process_data(*args: Any, **kwargs: Any) -> Any:
        # (data, worker_idx, ...): torchdata's StatefulDataLoader passes a state too, so
        # whatever comes is passed on as it came
        try:
            probe.batch_worker = int(args[1])
            probe.batch_held = sum(1 for v in info.values() if len(v) == 2)
        except Exception:  # never in the way of the batch
            pass
        return orig(*args, **kwargs)

    _process_data._starvation_hook = True  # type: ignore[attr-defined]
    it._process_data = _process_data
    return True


def batch_bytes(batch: Any) -> tuple[int, int]:
    """(bytes, tensors) of a batch's tensors, looked for through lists, tuples and dicts."""
    total = count = seen = 0
    todo = [batch]
    while todo and seen < MAX_WALK:
        x = todo.pop()
        seen += 1
        nbytes = getattr(x, "nbytes", None)
        if isinstance(nbytes, int) and hasattr(x, "shape"):
            total, count = total + nbytes, count + 1
        elif isinstance(x, dict):
            todo += list(x.values())
        elif isinstance(x, (list, tuple)):
            todo += list(x)
    return total, count


def _shm(path: str = "/dev/shm") -> tuple[float | None, float | None]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_blocks * st.f_frsize / 1e6, st.f_bavail * st.f_frsize / 1e6


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def start_method(loader: Any) -> str | None:
    ctx = getattr(loader, "multiprocessing_context", None)
    name = getattr(ctx, "get_start_method", None) if ctx is not None else None
    if callable(name):
        return str(name())
    if isinstance(ctx, str):
        return ctx
    mp = sys.modules.get("torch.multiprocessing") or sys.modules.get("multiprocessing")
    try:  # the one set, else the platform's default (forkserver on Python 3.14's Linux)
        return str(mp.get_start_method(allow_none=True)  # type: ignore[union-attr]
                   or mp.get_all_start_methods()[0])  # type: ignore[union-attr]
    except Exception:
        return None


def report(loader: Any, batch: Any) -> dict[str, Any]:
    """The epoch's figures (at its first batch): see the module's docstring."""
    nbytes, tensors = batch_bytes(batch)
    nw = int(getattr(loader, "num_workers", 0) or 0)
    pf = getattr(loader, "prefetch_factor", None) if nw > 0 else None
    shm_total, shm_free = _shm()
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    tmp = sys.modules.get("torch.multiprocessing")
    try:
        sharing = tmp.get_sharing_strategy() if tmp is not None else None
    except Exception:
        sharing = None
    ds = getattr(loader, "dataset", None)
    data = sys.modules.get("torch.utils.data")
    iterable = getattr(data, "IterableDataset", None)
    shards = None
    for name in ("n_shards", "num_shards"):  # HF datasets' IterableDataset, and others
        v = getattr(ds, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            shards = v
            break
    # a batched fetch: the dataset takes the batch's indices at once (`__getitems__`), or
    # the sampler hands whole batches to a loader that does not batch (batch_size=None)
    batched = bool(getattr(ds, "__getitems__", None)) or \
        getattr(loader, "batch_size", 0) is None
    return {
        "batch_bytes": nbytes, "batch_tensors": tensors, "num_workers": nw,
        "batch_size": getattr(loader, "batch_size", None), "batched_fetch": batched,
        "prefetch_factor": pf, "in_flight": nw * (pf or 0),
        "shm_total_mb": shm_total, "shm_free_mb": shm_free,
        "nofile_limit": None if soft == resource.RLIM_INFINITY else int(soft),
        "open_fds": _open_fds(), "sharing_strategy": sharing,
        "start_method": start_method(loader) if nw > 0 else None,
        "iterable": bool(iterable is not None and isinstance(ds, iterable)),
        "dataset": type(ds).__name__ if ds is not None else None, "shards": shards,
    }


def error_text(exc: BaseException) -> str:
    """The loader's error as one line: its type, the message's first line and, for an error
    re-raised from a worker (its traceback inside the message), the original's last line,
    where the cause is ('... No space left on device (28)')."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    head = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    if len(lines) > 1:
        head += f" ... {lines[-1]}"
    return head[:600]
