"""The probe's ways into a user's own training script.

- `python -m monitor run -- python train.py ARGS...` starts the script unmodified with
  `monitor/probe/_inject` first on PYTHONPATH; its `sitecustomize` calls `install()`, which
  patches `DataLoader.__iter__` as soon as the script imports torch. The first DataLoader the
  script iterates (the training loader in the usual loop) is timed; others pass through
  untouched.
- `from monitor import watch; for batch in watch(loader): ...` does the same explicitly.

Per step the one timing loop (monitor/probe/timing.py) records the data wait and the
compute; the process's Recorder (monitor/probe/recorder.py) records epochs and applies
requests. Only the standard library and monitor's store, records, config and control are
imported here: the user's environment needs torch and sqlite3, nothing else.
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from monitor.config import ATTACHED_PREFIX
from monitor.probe.epoch_plan import MidEpoch, every_steps
from monitor.probe.identity import job_key, rank_identity
from monitor.probe.loops import EVAL, loop_role, on_training_thread
from monitor.probe.recorder import Recorder, is_dataloader
from monitor.probe.timing import TimedIterator
from monitor.store import Store

RUN_ENV = "STARVATION_MONITOR_RUN_ID"
DB_ENV = "STARVATION_MONITOR_DB"


_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def recorder(name: str | None = None) -> Recorder:
    """The process's recorder: the run named by the environment (under `monitor run`), else
    a new attached run in the default store, finished when the process exits."""
    global _recorder
    with _recorder_lock:
        if _recorder is None:
            store = Store(os.environ.get(DB_ENV) or None)
            script = os.path.basename(sys.argv[0] or "python")
            env_run = os.environ.get(RUN_ENV)
            cfg = {"preset": "custom", "workload": f"{ATTACHED_PREFIX}{script}"}
            job = job_key()
            if env_run:
                run_id = int(env_run)
            elif job is not None:  # a rank of a job launched without `monitor run`
                run_id = store.job_run(job, name or script, cfg)
                if rank_identity()[0] == 0:  # the run lives as long as rank 0 (orphan check)
                    store.update_run(run_id, pid=os.getpid())
                atexit.register(lambda: store.finish_run(run_id, "finished"))
            else:
                run_id = store.create_run(name or script, "attached", cfg)
                store.update_run(run_id, pid=os.getpid())
                atexit.register(lambda: store.finish_run(run_id, "finished"))
            _recorder = Recorder(store, run_id, script)
        return _recorder


_busy = threading.local()  # loaders whose own __iter__ is running now (this thread)


def untimed(orig: Any) -> Any:
    """`orig(loader)` with the loader marked busy: a subclass whose __iter__ calls
    super().__iter__() (or an epoch plan rebuilt mid-epoch) reaches the patched base
    __iter__ again, which must then pass through, not start a second timed epoch."""
    def call(loader: Any) -> Any:
        ids = _busy.__dict__.setdefault("ids", set())
        ids.add(id(loader))
        try:
            return orig(loader)
        finally:
            ids.discard(id(loader))
    return call


def timed_iter(loader: Any, orig_iter: Any, explicit: bool = False) -> Iterator[Any]:
    """iter(loader), timed when it is the training loader (monitor/probe/loops.py), else
    untouched. Any iter() also ends the followed loader's pending step: its epoch ended (a
    loop that stops by length never calls next() again) or validation begins."""
    rec = recorder()
    orig = untimed(orig_iter)
    if not explicit and not on_training_thread():
        rec.skip(loader, f"iterated by thread {threading.current_thread().name!r}, not "
                         "the training loop's: its waits are not the loop's")
        return orig(loader)
    rec.end_open_step()
    if not explicit:
        role, why = loop_role(sys._getframe(1))
        if role == EVAL or not rec.should_follow(loader, role):
            rec.skip(loader, why if role == EVAL else
                     "a later loader of a plain loop (validation?); the first one is timed")
            return orig(loader)
        if rec.loader_id != id(loader):
            rec.follow(loader, role, why)
    elif rec.loader_id != id(loader):
        rec.follow(loader, None, "watch()")
    t0 = rec.probe.clock()
    rec.start_epoch(loader)
    mid = MidEpoch(loader, orig, rec.apply_pending, t0) \
        if every_steps() and rec.resumable(loader) else None
    it = TimedIterator(rec.probe, rec.epoch,
                       mid.make_iter if mid is not None else lambda: orig(loader),
                       t_start=t0, between=mid)
    rec.note_workers(it.inner)
    rec.open = it
    return it


def watch(loader: Any, name: str | None = None) -> Iterator[Any]:
    """`for batch in watch(loader): ...` times this epoch's steps into the store. A torch
    DataLoader is timed and tuned as under `monitor run`; any other iterable (torchdata.nodes,
    a thread loader's queue) has only its wait timed, and says so."""
    recorder(name)
    cls = type(loader)
    orig = getattr(cls, "_starvation_orig_iter", None)
    if orig is None:
        orig = cls.__iter__ if is_dataloader(loader) else (lambda x: iter(x))
    return timed_iter(loader, orig, explicit=True)


def _patch_class(cls: Any) -> None:
    """Wrap the __iter__ a class defines itself (DataLoader, and subclasses that replace it,
    such as torchdata's StatefulDataLoader)."""
    if "__iter__" not in cls.__dict__ or "_starvation_orig_iter" in cls.__dict__:
        return
    orig = cls.__dict__["__iter__"]

    def __iter__(self: Any) -> Any:
        if id(self) in _busy.__dict__.get("ids", ()):
            return orig(self)
        try:
            return timed_iter(self, orig)
        except Exception as exc:  # our bug must not stop their training
            print(f"starvation-monitor: probe disabled: {exc}", file=sys.stderr)
            return orig(self)

    cls._starvation_orig_iter = orig
    cls.__iter__ = __iter__


def _patch(module: Any) -> None:
    dl = module.DataLoader
    if "_starvation_orig_iter" in dl.__dict__:
        return
    _patch_class(dl)
    todo = list(dl.__subclasses__())
    while todo:  # subclasses defined before the patch
        sub = todo.pop()
        _patch_class(sub)
        todo += sub.__subclasses__()
    parent = dl.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: Any, **kwargs: Any) -> None:  # and those defined after
        if parent is not None:
            parent.__func__(cls, **kwargs)
        else:
            super(dl, cls).__init_subclass__(**kwargs)
        _patch_class(cls)

    dl.__init_subclass__ = classmethod(__init_subclass__)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches torch.utils.data.dataloader right after the script imports it."""

    target = "torch.utils.data.dataloader"

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patch DataLoader now if torch is loaded, else when the script imports it."""
    mod = sys.modules.get(_Finder.target)
    if mod is not None:
        _patch(mod)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
