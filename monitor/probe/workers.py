"""What the probe sees of a DataLoader's workers and of the limits its batches meet, inside
the training process (standard library only; torch read from sys.modules).

- Which worker produced each batch, and how many finished batches were held behind it: the
  multiprocessing iterator hands each batch to its `_process_data(data, worker_idx)`, so the
  probe wraps that one bound method of the iterator it times (one call and a few reads a
  batch; nothing of torch's is patched). `held` counts batches already finished by other
  workers that the in-order queue keeps until this one arrives: a slow sample holding the
  loop (head-of-line) shows as waits with batches held. `ready` counts the finished
  batches queued, not yet received, when the loop asks for this one (the iterator's
  `_next_data`, wrapped the same way): workers ahead of a loop that spends its wait
  receiving each batch (NOTE [the loop's receive] in monitor/diagnosis/costs.py), where a
  loop that waits for its workers finds none; and the loop thread's own time through that
  call (on a CPU, waiting for one: monitor/probe/thread_clock.py), which tells a loop at
  work receiving from one held by its workers' hand-off.
- Once an epoch, at its first batch, the figures a batch's journey depends on: its bytes and
  tensor count, the workers and prefetch in flight, /dev/shm's size and free space (batches
  pass through it), the open-files limit and descriptors open now (torch's default
  `file_descriptor` sharing holds one per tensor in flight), the sharing strategy and the
  start method; the loader's own iter() time (where spawn and forkserver pickle the dataset
  to each worker) and, once a loader, the dataset's pickled size where it is pickled.
- Each worker's first batch after the epoch's iter(): what an epoch's start is made of.
- The loader's own error, as it passes to the loop untouched (a worker killed by a signal,
  'received 0 items of ancdata'), so the run's reason can name the cause; and the
  /dev/shm segments a killed worker left behind, removed (remove_dead_segments).
"""
from __future__ import annotations

import os
import pickle
import resource
import signal
import sys
import time
import weakref
from typing import Any

from monitor.config import in_flight
from monitor.probe import thread_clock
from monitor.probe.loaders import is_nodes_loader, workers_of

MAX_WALK = 256  # items looked at when counting a batch's tensors and bytes


# NOTE [no cycle through the iterator]
# The wrapper is an attribute of the iterator: holding the iterator's bound method would
# make a cycle (iterator -> wrapper -> method -> iterator), and a loop that breaks
# mid-epoch would leave the iterator to the garbage collector. Its __del__, which shuts
# the workers down gently, would then run at some later collection, or never: at exit
# the workers are killed and each leaves its /tmp/pymp-* folder behind. The class's
# function and a weak reference keep the bare loader's lifetime.
def hook(it: Any, probe: Any, t_start: float | None = None) -> bool:
    """Count per batch which worker produced it (probe.batch_worker), the finished batches
    held behind it (probe.batch_held) and those queued as the loop asked for it
    (probe.batch_ready); once every worker has delivered its first batch, hand their times
    from `t_start` (the epoch's iter()) to probe.on_workers_ready. False when `it` is no
    multiprocessing DataLoader iterator (0 workers, a generator, another library's
    loader)."""
    orig = getattr(it, "_process_data", None)
    info = getattr(it, "_task_info", None)
    if orig is None or not isinstance(info, dict) or getattr(orig, "_starvation_hook", False):
        return False
    first: dict[int, float] = {}
    n = int(getattr(it, "_num_workers", 0) or 0)
    # the finished batches still queued (a multiprocessing queue counts what the workers
    # put; with pin_memory, the pinning thread's queue): None where it cannot say (macOS)
    qsize = getattr(getattr(it, "_data_queue", None), "qsize", None)
    try:
        qsize()  # type: ignore[misc]
    except Exception:
        qsize = None
    call = unbound(it, "_process_data")
    del orig

    def _process_data(*args: Any, **kwargs: Any) -> Any:
        # (data, worker_idx, ...): torchdata's StatefulDataLoader passes a state too, so
        # whatever comes is passed on as it came
        try:
            w = int(args[1])
            probe.batch_worker = w
            probe.batch_held = sum(1 for v in info.values() if len(v) == 2)
            if t_start is not None and w not in first and len(first) < n:
                first[w] = probe.clock() - t_start
                ready = probe.on_workers_ready
                if len(first) == n and ready is not None:
                    ready([first[i] for i in sorted(first)])
        except Exception:  # never in the way of the batch
            pass
        return call(*args, **kwargs)

    _process_data._starvation_hook = True  # type: ignore[attr-defined]
    it._process_data = _process_data
    if qsize is not None and callable(getattr(it, "_next_data", None)):
        # counted as the loop asks: at the batch's receipt, a batch finished meanwhile by
        # another worker (2 workers in step, each 120 ms a batch) is queued behind it,
        # while the loop waited for the workers all the same (47% of such a wait read as
        # made ahead at receipt, 1% at the ask)
        ask = unbound(it, "_next_data")
        # ... and the loop thread's own time through the receiving (with pin_memory the
        # pinning thread receives, not the loop's: not read); its wait for a CPU on one
        # receipt in RUNQ_EVERY
        timed = not getattr(it, "_pin_memory", False)
        count = [0]

        def _next_data(*args: Any, **kwargs: Any) -> Any:
            try:
                probe.batch_ready = qsize()
            except Exception:  # never in the way of the batch
                pass
            if not timed:
                return ask(*args, **kwargs)
            count[0] += 1
            runq = thread_clock.runq() if count[0] % thread_clock.RUNQ_EVERY == 0 else None
            on = thread_clock.cpu()
            data = ask(*args, **kwargs)
            try:
                probe.batch_wait_cpu = thread_clock.cpu() - on
                if runq is not None:
                    later = thread_clock.runq()
                    probe.batch_wait_runq = later - runq if later is not None else None
            except Exception:  # never in the way of the batch
                pass
            return data

        it._next_data = _next_data
    return True


def unbound(it: Any, name: str) -> Any:
    """`it`'s method `name` to call from a wrapper set on the instance, without holding `it`
    (NOTE [no cycle through the iterator]); a wrapper already on the instance is called as
    it is."""
    if name in vars(it):
        return getattr(it, name)
    ref, fn = weakref.ref(it), getattr(type(it), name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(ref(), *args, **kwargs)
    return call


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


class _Count:
    """A file that only counts what is written to it."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, b: bytes) -> int:
        self.n += len(b)
        return len(b)


def pickled_bytes(obj: Any) -> int | None:
    """About the bytes a spawned worker receives of `obj` (the dataset), counted without
    holding them; None when it does not pickle here. Plain pickle, not multiprocessing's
    ForkingPickler: torch's reducers there would move the dataset's tensors into shared
    memory as a side effect (the same size either way: a tensor's bytes go to the worker,
    through the pipe or through /dev/shm)."""
    try:
        out = _Count()
        pickle.Pickler(out, protocol=4).dump(obj)
        return out.n
    except Exception:
        return None


HELD_ITEMS = 200_000  # objects a dataset's walk looks at, at most (a list of arrays: each)


def held_bytes(ds: Any) -> tuple[int, str | None]:
    """(bytes, the attribute holding most of them) the dataset object keeps in memory as
    tensors, arrays (anything with `nbytes`: numpy, without importing it) and bytes, in its
    attributes and one level of lists, tuples and dicts in them (Ultralytics' `ims` with
    cache=True is a list of arrays); a storage shared by several tensors counted once.
    A walk, once a dataset, of at most HELD_ITEMS objects."""
    seen: set[int] = set()
    budget = [HELD_ITEMS]

    def size(x: Any) -> int:
        budget[0] -= 1
        if isinstance(x, (bytes, bytearray, memoryview)):
            return len(x)
        storage = getattr(x, "untyped_storage", None)
        if callable(storage) and hasattr(x, "data_ptr"):
            try:
                st = storage()
                key = st.data_ptr()
                if key in seen or getattr(x, "is_cuda", False) or x.is_meta or \
                        getattr(st, "filename", None):  # a mapped file: the page cache's
                    return 0
                seen.add(key)
                return int(st.nbytes())
            except Exception:
                return 0
        n = getattr(x, "nbytes", None)
        if isinstance(n, int) and not isinstance(x, type):
            base = getattr(x, "base", None)  # a view of another array: its base counts
            key = id(base if base is not None else x)
            # a mapped file is the page cache's, one copy a host: np.memmap (its filename),
            # HF datasets' Arrow tables read from disk (MemoryMappedTable; InMemoryTable,
            # keep_in_memory=True, is a copy and counts)
            if key in seen or getattr(x, "filename", None) is not None or \
                    "MemoryMapped" in type(x).__name__:
                return 0
            seen.add(key)
            return n
        return 0

    try:
        return _held(ds, size, budget)
    except Exception:  # a property that raises: weigh nothing, never the loop's problem
        return 0, None


def _held(ds: Any, size: Any, budget: list[int]) -> tuple[int, str | None]:
    per: dict[str, int] = {}
    for name, v in list(getattr(ds, "__dict__", {}).items()):
        if budget[0] <= 0:
            break
        total = size(v)
        if isinstance(v, (list, tuple)):
            total += sum(size(x) for x in v[:max(0, budget[0])])
        elif isinstance(v, dict):
            total += sum(size(x) for x in list(v.values())[:max(0, budget[0])])
        if total:
            per[name] = total
    if not per:
        return 0, None
    return sum(per.values()), max(per, key=per.get)


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
    # a torchdata.nodes pipeline's worker processes are its ParallelMapper's, started at
    # each iter(loader): it has no persistent workers
    nodes = is_nodes_loader(loader)
    procs = workers_of(loader)
    nw = int(getattr(procs, "num_workers", 0) or 0)
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
        "prefetch_factor": pf, "in_flight": in_flight({"num_workers": nw, "prefetch_factor": pf}),
        "shm_total_mb": shm_total, "shm_free_mb": shm_free,
        "nofile_limit": None if soft == resource.RLIM_INFINITY else int(soft),
        "open_fds": _open_fds(), "sharing_strategy": sharing,
        "start_method": start_method(procs) if nw > 0 else None,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "loader_kind": "torchdata.nodes" if nodes else None,
        "iterable": bool(iterable is not None and isinstance(ds, iterable)),
        "dataset": type(ds).__name__ if ds is not None else None, "shards": shards,
    }


def error_text(exc: BaseException) -> str:
    """The loader's error as one line: its type, the message's first line and, for an error
    re-raised from a worker (its traceback inside the message), the original's last line,
    where the cause is ('... No space left on device (28)'); an error raised from another
    (torch's "worker exited unexpectedly" from "killed by signal: Killed") says that one's
    too, since the cause is in it."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen and len(parts) < 3:
        seen.add(id(exc))
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        head = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        if len(lines) > 1:
            head += f" ... {lines[-1]}"
        parts.append(head)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return (" (from ".join(parts) + ")" * (len(parts) - 1))[:600]


# Errors a worker's death raises in the main process before the worker is reaped: a batch's
# shared-memory handle cut off mid-send (EOFError, a reset connection), torch's queue timeout.
DEATH_ERRORS = (EOFError, ConnectionError)
DEATH_WAIT_S = 2.0  # how long such an error waits for the dead worker's exit code


def exit_note(procs: Any, exc: BaseException | None = None) -> str:
    """How the epoch's workers that have ended ended, in torch's words ('DataLoader worker
    (pid 123) is killed by signal: Killed.'), for an error that does not say: torch raises
    "exited unexpectedly" from a queue timeout when its SIGCHLD handler did not run first.
    Read from the worker processes' exit codes (multiprocessing reaps them); '' if none.
    After an error a death raises (`exc`: EOFError while a killed worker's batch was being
    received), the kernel may not have finished the kill: it polls up to DEATH_WAIT_S for
    an exit code (the loop is failing already; any other error is not delayed)."""
    procs = list(procs or ())
    if isinstance(exc, DEATH_ERRORS) or "exited unexpectedly" in str(exc or ""):
        deadline = time.monotonic() + DEATH_WAIT_S
        while not _ended(procs) and time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except Exception:  # torch's SIGCHLD handler raising the death inside the wait:
                break  # the worker has ended (its exit code read below)
    out = []
    for w in procs:
        try:
            code = w.exitcode
        except Exception:  # not a process this one started
            continue
        if isinstance(code, int) and code < 0:
            try:
                name = signal.strsignal(-code) or f"signal {-code}"
            except ValueError:
                name = f"signal {-code}"
            out.append(f"DataLoader worker (pid {w.pid}) is killed by signal: {name}.")
        elif isinstance(code, int) and code > 0:
            out.append(f"DataLoader worker (pid {w.pid}) exited with code {code}.")
    return " ".join(out)


def killed_note(procs: Any) -> str:
    """At exit: the workers a signal ended, other than a stop (SIGTERM, SIGINT), in torch's
    words ('DataLoader worker (pid 123) is killed by signal: Killed.'); '' if none. torch
    raises such a death from its SIGCHLD handler wherever the loop is (its forward, a sleep),
    not from the loader, so the loader's error path never sees it."""
    dead = []
    for w in procs or ():
        try:
            code = w.exitcode
        except Exception:  # not a process this one started
            continue
        if isinstance(code, int) and code < 0 and -code not in (signal.SIGTERM, signal.SIGINT):
            dead.append(w)
    return exit_note(dead) if dead else ""


def _ended(procs: list[Any]) -> bool:
    """Whether any of the worker processes has an exit code (no process objects: True)."""
    codes = []
    for w in procs:
        try:
            codes.append(w.exitcode)
        except Exception:  # not a process this one started
            continue
    return not codes or any(c is not None for c in codes)


def _dead(pid: int) -> bool:
    """Whether `pid` has exited (gone, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return not os.path.isdir(f"/proc/{pid}") if os.path.isdir("/proc") else False
    return state in (b"Z", b"X")


def remove_dead_segments(pids: Any, root: str = "/dev/shm") -> list[str]:
    """Remove the shared-memory segments torch made in processes that are now dead, and
    return their names. torch names a segment torch_<creator's pid>_<n>_<n> and unlinks it
    as soon as it is mapped; a worker the kernel kills in between (the OOM killer, at a
    cgroup's limit) leaves it in /dev/shm for good, holding its memory. A live process's
    segments are never touched."""
    dead = {int(p) for p in pids or () if p and _dead(int(p))}
    if not dead:
        return []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in names:
        parts = name.split("_")
        if len(parts) < 3 or parts[0] != "torch" or not parts[1].isdigit():
            continue
        if int(parts[1]) in dead:
            try:
                os.unlink(os.path.join(root, name))
                removed.append(name)
            except OSError:  # gone already, or not ours to remove
                pass
    return removed
