"""Reproducers of the causes real jobs starve from, as plain training scripts (no monitor
imports): `python causes.py KIND [--workers N] [--seconds S]`. Each prints its own
samples/s at the end (`rate N samples/s`), so a test compares bare runs at two settings.

- idle_shards: an IterableDataset with one shard: only worker 0 yields, the others stop at
  once (as datasets' IterableDataset does with fewer shards than workers). It prints how
  many workers delivered batches.
- mem_growth: a per-sample cache that never evicts: each worker keeps every sample it made
  (about 1 MB each), so worker memory grows until the job is killed.
- head_of_line: every 32nd sample takes 150 ms: with 4 workers the in-order queue holds
  the loop on that batch while the others' batches sit finished (--any-order: the fix).
- shm: 12 MB batches through a small /dev/shm (run it inside a mount namespace whose
  /dev/shm is a small tmpfs): the workers' batches in flight do not fit.
- cpu_heavy: a fixed 3 ms of CPU work per sample, 10 ms "device" steps: starving at 0
  workers, more so while other jobs keep the cores busy (contention: workers still gain).
- tiny: scalar samples in batches of 1024: the per-sample fetch and collate is the whole
  cost, and workers add pickling (--batched: `__getitems__`, one fetch per batch: the fix).
- in_memory: batches already made, in memory (a preloaded tensor dataset, batch_size=None):
  a fetch is an index, and a worker's hand-off of each batch (through /dev/shm, a pipe and
  unpickling in the loop's own thread) costs the loop more than the fetch it takes over.
- startup: short epochs with a 60 MB dataset object and the spawn start method, workers
  not persistent: every epoch starts them again and pickles the dataset to each.
- files: each sample opens one of 200 files of 16 KB and reads it, then waits 4 ms (a
  remote lock, a service): from the page cache, the wait is not storage; `--cold` drops
  each file from the page cache before its read, as a cold file on a disk is (storage).
- fds: batches of 300 small tensors with the open-files limit set to 128 in this process
  (torch's default file_descriptor sharing keeps one descriptor per tensor in flight).
- rank_cache: under torchrun, each rank loads a --cache-mb dataset into its own memory (a
  preloaded tensor); --mmap: local rank 0 writes it to a file once and every rank maps it
  (torch.from_file, shared): one copy a host. Each rank prints its PSS at the end.
- threads: each worker's samples are torch matrix products, with its intra-op pool set to
  --pool threads in worker_init_fn (default: one a CPU, as a library that sizes its own
  pool does): pool x workers threads on the cores (--pool 1: the fix).
- main_threads: CPU-heavy samples (as cpu_heavy) in 2 workers, and a step of torch matrix
  products on the host with torch's intra-op pool (one thread a CPU by default) beside
  them (--main-threads 1: the fix).
- remote: each sample fetched over HTTP from a server in this process (127.0.0.1, 15 ms
  a GET, 16 KB): the loaders wait on sockets, on no CPU and no disk.
- fields: each sample a dict of 20 small tensors (the fields a detection or NLP sample
  has), batches of 16, a 5 ms step: the workers keep ahead, and the loop's own receiving
  of each batch (a descriptor fetched from a worker for each of its 20 tensors) is the
  wait (--sharing file_system, or --stacked: one tensor a sample, the fixes).
- tokenizer: a fast (HF `tokenizers`) tokenizer trained and used on a batch in this process,
  then in each forked worker: with TOKENIZERS_PARALLELISM=true in the environment the
  workers deadlock at their first encode (its thread pool was forked mid-use); =false, or
  unset, they deliver.
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

CACHE: dict[int, torch.Tensor] = {}
DECODE_S = 0.002  # idle_shards: a sample's decoding (a batch of 8: 16 ms in one worker)


class OneShard(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is not None and info.id > 0:
            return  # no shard left for this worker
        wid = float(info.id) if info is not None else 0.0
        for i in range(self.n):
            t = time.perf_counter()
            while time.perf_counter() - t < DECODE_S:  # decoding
                pass
            yield torch.tensor([float(i), wid, 0.0, 0.0])  # [1]: the worker that made it


class Cached(Dataset):
    def __init__(self, kb: int = 1024) -> None:
        self.rows = max(1, kb // 4)  # rows of 1,024 floats

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        if i not in CACHE:
            CACHE[i] = torch.rand(self.rows, 1024)  # 1 MB by default, kept forever
        time.sleep(0.004)  # sleep-ok: the workload's modelled work
        return CACHE[i][0, :4].clone()


class OneSlow(Dataset):
    """Every 32nd sample is a huge image: 150 ms to decode, the rest 1 ms."""

    def __init__(self, n: int = 100_000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(0.15 if i % 32 == 0 else 0.001)  # sleep-ok: the workload's modelled work
        return torch.full((4,), float(i))


class Files(Dataset):
    """200 files of 16 KB in a folder of their own, read one a sample."""

    def __init__(self, cold: bool) -> None:
        import atexit
        import os
        import shutil
        import tempfile
        self.cold = cold
        self.folder = tempfile.mkdtemp(prefix="causes-files-")
        atexit.register(shutil.rmtree, self.folder, True)
        for i in range(200):
            with open(os.path.join(self.folder, f"{i}.bin"), "wb") as f:
                f.write(os.urandom(16 * 1024))
        os.sync()

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        import os
        fd = os.open(os.path.join(self.folder, f"{i % 200}.bin"), os.O_RDONLY)
        try:
            if self.cold:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            data = os.read(fd, 16 * 1024)
        finally:
            os.close(fd)
        time.sleep(0.004)  # sleep-ok: the workload's modelled work
        return torch.tensor(len(data))


class Big(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        return torch.full((3 * 1024 * 1024 // 4,), float(i))  # 3 MB a sample: 12 MB a batch


class Busy(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        x = 0
        for k in range(60_000):  # decoding and augmenting: about 3 ms of CPU, fixed work
            x += k * k
        return torch.full((4,), float(i + x % 7))


class Tiny(Dataset):
    def __init__(self, batched: bool) -> None:
        self.data = torch.arange(1_000_000, dtype=torch.float32)
        if batched:  # one fetch for the whole batch
            self.__getitems__ = lambda idx: {"x": self.data[torch.tensor(idx)],
                                             "y": torch.tensor(idx) % 10}

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return {"x": self.data[i], "y": i % 10}


class InMemory(Dataset):
    """Batches made before training, each 64 KB."""

    def __init__(self, n: int) -> None:
        self.batches = torch.zeros(256, 16 * 1024)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.batches[i % len(self.batches)]


class Heavy(Dataset):
    """A dataset object that carries its index as 60 MB of Python-side data."""

    def __init__(self) -> None:
        self.index = bytes(60 * 1024 * 1024)

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        return torch.full((4,), float(i))


class Preloaded(Dataset):
    """A dataset loaded into memory at start: a copy in every rank, or (mmap) one file
    mapped by all of a host's ranks."""

    def __init__(self, mb: int, mmap: bool) -> None:
        n = mb * 1024 * 1024 // 4
        if not mmap:
            self.data = torch.ones(n)  # every page written: resident
        else:
            path = f"/tmp/sm-rank-cache-{os.getppid()}-{mb}.bin"  # the launcher's: one a job
            if os.environ.get("LOCAL_RANK", "0") == "0":
                torch.ones(n).numpy().tofile(path + ".part")
                os.replace(path + ".part", path)
            deadline = time.monotonic() + 120
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)  # sleep-ok: polling for rank 0's file, with a deadline
            self.data = torch.from_file(path, shared=True, size=n, dtype=torch.float32)
            float(self.data.sum())  # every page read: resident, once a host
        self.rows = n // 1024

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int):
        return self.data[i * 1024:(i + 1) * 1024].clone()


def pss_mb() -> float:
    """This process's proportional set size (shared pages split among their mappers)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Products(Dataset):
    """A sample is a few matrix products (decoding, resizing in a library with a pool)."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        a = torch.rand(256, 256)
        for _ in range(4):
            a = torch.tanh(a @ a)
        return a[0, :4].clone()


def _pool(threads: int):
    """worker_init_fn: the worker's own pool, sized as a library sizes it."""
    def init(_worker: int) -> None:
        torch.set_num_threads(threads)
    return init


class Remote(Dataset):
    """Samples behind an HTTP server of this process's own (a bucket, an object store)."""

    LATENCY_S, BYTES = 0.015, 16 * 1024

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Slow(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(Remote.LATENCY_S)  # sleep-ok: the modelled round trip
                self.send_response(200)
                self.send_header("Content-Length", str(Remote.BYTES))
                self.end_headers()
                self.wfile.write(b"\0" * Remote.BYTES)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/sample"

    def __getstate__(self) -> dict:  # (spawned workers: the URL only)
        return {"url": self.url}

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        import urllib.request
        with urllib.request.urlopen(f"{self.url}/{i}", timeout=30) as r:
            data = r.read()
        return torch.tensor([float(len(data))])


class Tokenized(Dataset):
    """Texts encoded by a fast tokenizer made here, and used here once (its thread pool
    runs in this process before the workers fork)."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        words = [f"w{i}" for i in range(5000)]
        self.tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        self.tok.pre_tokenizer = pre_tokenizers.Whitespace()
        self.tok.train_from_iterator(
            (" ".join(words[i:i + 50]) for i in range(0, 5000, 50)),
            trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]"], show_progress=False))
        self.texts = [" ".join(words[i:i + 200]) for i in range(0, 4000, 10)]
        self.tok.encode_batch(self.texts)  # the pool runs here, in the parent

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        enc = self.tok.encode_batch(self.texts[i % 300:i % 300 + 8])
        return torch.tensor([float(len(e.ids)) for e in enc])


class ManyTensors(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        return [torch.full((2,), float(i)) for _ in range(300)]


class Fields(Dataset):
    def __init__(self, stacked: bool) -> None:
        self.stacked = stacked

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        if self.stacked:
            return {"x": torch.full((20, 4), float(i))}
        return {"x": torch.full((4,), float(i)),
                **{f"f{k}": torch.full((4,), float(k)) for k in range(19)}}


def build(kind: str, workers: int, in_any_order: bool = False,
          batched: bool = False, persistent: bool = False, samples: int = 0,
          grow_kb: int = 1024, cold: bool = False, cache_mb: int = 300,
          mmap: bool = False, pool: int = 0, stacked: bool = False) -> DataLoader:
    if kind == "idle_shards":
        return DataLoader(OneShard(100_000), batch_size=8, num_workers=workers)
    if kind == "mem_growth":
        return DataLoader(Cached(grow_kb), batch_size=4, num_workers=workers, shuffle=True)
    if kind == "head_of_line":
        return DataLoader(OneSlow(samples or 100_000), batch_size=4, num_workers=workers,
                          in_order=not in_any_order)
    if kind == "shm":
        return DataLoader(Big(), batch_size=4, num_workers=workers, prefetch_factor=2)
    if kind == "cpu_heavy":
        return DataLoader(Busy(), batch_size=8, num_workers=workers)
    if kind == "tiny":
        return DataLoader(Tiny(batched), batch_size=1024, num_workers=workers, shuffle=True,
                          collate_fn=None if not batched else lambda b: b)
    if kind == "in_memory":
        return DataLoader(InMemory(samples or 20_000), batch_size=None, num_workers=workers)
    if kind == "startup":
        return DataLoader(Heavy(), batch_size=64, num_workers=workers,
                          multiprocessing_context="spawn" if workers else None,
                          persistent_workers=persistent and workers > 0)
    if kind == "files":
        return DataLoader(Files(cold), batch_size=8, num_workers=workers)
    if kind == "rank_cache":
        return DataLoader(Preloaded(cache_mb, mmap), batch_size=16, num_workers=workers,
                          shuffle=True)
    if kind == "threads":
        return DataLoader(Products(), batch_size=8, num_workers=workers,
                          worker_init_fn=_pool(pool))
    if kind == "main_threads":
        return DataLoader(Busy(), batch_size=8, num_workers=workers)
    if kind == "remote":
        return DataLoader(Remote(), batch_size=8, num_workers=workers)
    if kind == "tokenizer":
        return DataLoader(Tokenized(), batch_size=4, num_workers=workers)
    if kind == "fds":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(128, hard), hard))
        return DataLoader(ManyTensors(), batch_size=1, num_workers=workers,
                          collate_fn=lambda b: b[0])
    if kind == "fields":
        return DataLoader(Fields(stacked), batch_size=16, num_workers=workers)
    raise SystemExit(f"unknown kind {kind!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--epochs", type=int, default=0, help="run exactly this many epochs")
    ap.add_argument("--min-batches", type=int, default=0,
                    help="run on past --seconds until this many batches (a busy box's evidence)")
    ap.add_argument("--epoch-seconds", type=float, default=0.0,
                    help="with --epochs: an epoch also ends after this long")
    ap.add_argument("--sharing", default=None, help="torch's sharing strategy (the fds fix)")
    ap.add_argument("--any-order", action="store_true", help="in_order=False (the fix)")
    ap.add_argument("--batched", action="store_true", help="tiny: __getitems__ (the fix)")
    ap.add_argument("--persistent", action="store_true", help="persistent_workers (the fix)")
    ap.add_argument("--grow-kb", type=int, default=1024, help="mem_growth: KB cached a sample")
    ap.add_argument("--samples", type=int, default=0, help="head_of_line: an epoch's samples")
    ap.add_argument("--cold", action="store_true", help="files: dropped from the page cache")
    ap.add_argument("--step-ms", type=float, default=3.0, help="the modelled device step")
    ap.add_argument("--cache-mb", type=int, default=300, help="rank_cache: the dataset's MB")
    ap.add_argument("--mmap", action="store_true", help="rank_cache: one mapped file (the fix)")
    ap.add_argument("--pool", type=int, default=0,
                    help="threads: a worker's pool (default: one a CPU; 1: the fix)")
    ap.add_argument("--stacked", action="store_true",
                    help="fields: one tensor a sample (the fix)")
    ap.add_argument("--main-threads", type=int, default=0,
                    help="main_threads: torch's pool in the main process (1: the fix)")
    a = ap.parse_args()
    if a.sharing:
        torch.multiprocessing.set_sharing_strategy(a.sharing)
    loader = build(a.kind, a.workers, a.any_order, a.batched, a.persistent, a.samples,
                   a.grow_kb, a.cold, a.cache_mb, a.mmap, a.pool or (os.cpu_count() or 1),
                   a.stacked)
    if a.main_threads or a.kind == "main_threads":  # (torch's default, whatever the
        # environment says: NOTE [one intra-op thread in the suite] in tests/conftest.py)
        torch.set_num_threads(a.main_threads or len(os.sched_getaffinity(0)))
    w = torch.rand(384, 384) if a.kind == "main_threads" else None  # the host step's model
    start, n, samples = time.perf_counter(), 0, 0
    makers: set[int] = set()  # idle_shards: the workers that delivered batches
    first = None
    epochs = 0
    # epochs until the time is up, or exactly --epochs of them
    def more() -> bool:
        return time.perf_counter() - start <= a.seconds or n < a.min_batches

    while (epochs < a.epochs) if a.epochs else more():
        epochs += 1
        began = time.perf_counter()
        for i, batch in enumerate(loader):
            if i == 0 and a.kind == "head_of_line" and a.epochs:  # (a change lands at iter())
                print(f"epoch {epochs - 1} in_order={loader.in_order}", flush=True)
            if first is None:
                first = time.perf_counter()
            # (no step: sleep(0) yields the CPU, on a busy box a step of its own)
            if w is not None:  # a step on the host's CPU, with torch's intra-op pool
                x = w
                for _ in range(6):
                    x = torch.tanh(x @ w)
            elif a.step_ms:
                time.sleep(a.step_ms / 1000)  # sleep-ok: the modelled device step
            n += 1
            if a.kind == "idle_shards":
                makers.update(int(w) for w in batch[:, 1].tolist())
            samples += len(batch) if isinstance(batch, torch.Tensor) else \
                len(batch["x"]) if isinstance(batch, dict) else 1
            if not a.epochs and not more():
                break
            if a.epoch_seconds and time.perf_counter() - began > a.epoch_seconds:
                break
    took = time.perf_counter() - (first or start)
    print(f"rate {n / took:.1f} batches/s ({n} batches, {samples / took:.0f} samples/s)",
          flush=True)
    if makers:
        print(f"workers delivering {len(makers)} of {a.workers}", flush=True)
    if a.kind == "rank_cache":  # measured while every rank of the host still maps it
        import glob

        import torch.distributed as dist
        joined = "MASTER_ADDR" in os.environ
        if joined:
            dist.init_process_group("gloo")
            dist.barrier()
        print(f"pss_mb rank {os.environ.get('RANK', '0')} {pss_mb():.0f}", flush=True)
        if joined:
            dist.barrier()
            dist.destroy_process_group()
        if os.environ.get("LOCAL_RANK", "0") == "0":
            for f in glob.glob(f"/tmp/sm-rank-cache-{os.getppid()}-*"):
                os.remove(f)


if __name__ == "__main__":
    main()
