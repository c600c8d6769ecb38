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
import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from monitor.config import attached_config
from monitor.probe.env import RUN_ENV, SCRIPT_ENV
from monitor.probe.epoch_plan import MidEpoch, every_steps
from monitor.probe.identity import job_key, rank_identity
from monitor.probe.lifeline import bind_to_parent
from monitor.probe.loaders import describe_loader, is_dataloader
from monitor.probe.loops import EVAL, loop_role, on_training_thread
from monitor.probe.recorder import Recorder
from monitor.probe.timing import TimedIterator
from monitor.probe.untimed import watch_waits
from monitor.records import PROBE
from monitor.ring import ENV as RELAY_ENV
from monitor.store import ATTACHED, ENV_VAR, FINISHED, Store

DB_ENV = ENV_VAR  # the store the recorder writes (monitor/store/core.py)


_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def script_name(argv0: str | None = None, env: dict[str, str] | None = None,
                main: Any = None) -> str:
    """What a run recorded in this process is named after: the script's file name; in a
    Jupyter kernel (whose argv[0] is ipykernel_launcher.py) the notebook's, which Jupyter's
    server passes to the kernel in JPY_SESSION_NAME and VS Code sets in the kernel's globals
    (`__vsc_ipynb_file__`, the __main__ module of a kernel)."""
    env = env if env is not None else dict(os.environ)
    argv0 = argv0 if argv0 is not None else (sys.argv[0] if sys.argv else "")
    name = os.path.basename(argv0 or "python")
    if name in ("ipykernel_launcher.py", "ipykernel_launcher", "__main__.py"):
        main = main if main is not None else sys.modules.get("__main__")
        notebook = env.get("JPY_SESSION_NAME") or getattr(main, "__vsc_ipynb_file__", None)
        if isinstance(notebook, str) and notebook:
            return os.path.basename(notebook)
    return name


def recorder(name: str | None = None) -> Recorder:
    """The process's recorder: the run named by the environment (under `monitor run`), else
    a new attached run in the default store, finished when the process exits."""
    global _recorder
    with _recorder_lock:
        if _recorder is None:
            store = Store(os.environ.get(DB_ENV) or None)
            script = os.environ.get(SCRIPT_ENV) or script_name()
            env_run = os.environ.get(RUN_ENV)
            cfg = attached_config(script)
            job = job_key()
            if env_run:
                run_id = int(env_run)
            elif job is not None:  # a rank of a job launched without `monitor run`
                run_id = store.job_run(job, name or script, cfg)
                if rank_identity()[0] == 0:  # the run lives as long as rank 0 (orphan check)
                    store.update_run(run_id, pid=os.getpid())
                atexit.register(lambda: store.finish_run(run_id, FINISHED))
            else:
                run_id = store.create_run(name or script, ATTACHED, cfg)
                store.update_run(run_id, pid=os.getpid())
                atexit.register(lambda: store.finish_run(run_id, FINISHED))
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


# NOTE [fail-safe probe]
# The probe runs inside the user's loop, so nothing of its own may raise there or change what
# the loop receives (DESIGN.md: the probe is fail-safe). Three layers hold that:
# 1. timed_iter: the probe's decisions before iter(loader) are guarded; the loader's own
#    __iter__ runs exactly once, outside every guard, so the user's errors (a broken
#    dataset, a worker that fails to start) reach the loop as in a bare run, and nothing is
#    started twice. A probe error there passes the loader through untimed.
# 2. TimedIterator.__next__ (monitor/probe/timing.py): only next(inner) may raise; an error
#    in the bookkeeping around it goes to Probe.on_fault and the epoch passes through.
# 3. Recorder.fault (monitor/probe/recorder.py): the loader is not timed again; a `probe`
#    event holds the exception and the loader's class, stderr says it once, and the run's
#    verdict says that timing stopped and why. Store failures take Probe.on_error the same
#    way (recording stops, the training goes on).
# A loader whose class overrides __iter__ is timed at that __iter__ only: the base
# DataLoader.__iter__ it reaches (from super().__iter__(), or from its __init__ as timm's
# MultiEpochsDataLoader does) passes through, so one iterator is never timed twice over.

_said: set[str] = set()


def _say_once(key: str, text: str) -> None:
    if key not in _said:
        _said.add(key)
        print(f"starvation-monitor: {text}", file=sys.stderr)


def _no_recorder(exc: Exception, loader: Any) -> None:
    """The recorder could not start: say so once, and leave the run a note if the store
    takes one (under `monitor run`), so its verdict does not read 'no DataLoader'."""
    text = (f"timing stopped for {type(loader).__name__} (starting the recorder): "
            f"{type(exc).__name__}: {exc}. Your training goes on untouched")
    if "recorder" in _said:
        return
    _say_once("recorder", text)
    try:
        run_id = int(os.environ[RUN_ENV])
        Store(os.environ.get(DB_ENV) or None).add_event(
            run_id, PROBE, text, {"stopped": "timing", "loader": type(loader).__name__,
                                    "where": "starting the recorder", "at_step": 0,
                                    "error": f"{type(exc).__name__}: {exc}"})
    except Exception:
        pass


def timed_iter(loader: Any, orig_iter: Any, explicit: bool = False) -> Iterator[Any]:
    """iter(loader), timed when it is the training loader (monitor/probe/loops.py), else
    untouched. Any iter() also ends the followed loader's pending step: its epoch ended (a
    loop that stops by length never calls next() again) or validation begins."""
    orig = untimed(orig_iter)
    rec: Recorder | None = None
    try:
        rec = recorder()
        t0 = _plan(rec, loader, explicit, sys._getframe(1))
        mid = (MidEpoch(loader, orig, rec.apply_pending, t0, resumable=rec.resumable)
               if t0 is not None and t0 is not PROBATION and t0 is not WATCHED
               and every_steps() and rec.resumable(loader) else None)
    except Exception as exc:
        if rec is not None:
            rec.fault(exc, "at iter()", loader)
        else:
            _no_recorder(exc, loader)
        return orig(loader)
    if t0 is None:
        return orig(loader)
    if t0 is WATCHED or t0 is PROBATION:  # (the loader's own __iter__ outside our try: its
        # errors are the user's); its waits watched until it is timed, if ever
        t_iter = rec.probe.clock()
        it = orig(loader)
        try:
            watch_waits(it, rec.probe, describe_loader(loader))
        except Exception:  # not watched, then; never a fault that stops the loader's timing
            pass  # (a pass on probation is the training loader's)
        if t0 is WATCHED:
            return it
        return rec.probation(loader, it, t_iter,
                             lambda rest, first: _time_the_rest(rec, loader, rest, first))
    # the loader's own __iter__ runs in here, once; its errors are the user's
    it = TimedIterator(rec.probe, rec.epoch,
                       mid.make_iter if mid is not None else lambda: orig(loader),
                       t_start=t0, between=mid)
    try:
        rec.note_workers(loader, it.inner)
        rec.open = it
    except Exception as exc:
        rec.fault(exc, "after iter()", loader)
        return it.inner
    return it


def _time_the_rest(rec: Recorder, loader: Any, rest: Iterator[Any],
                   first: tuple[float, float, Any]) -> TimedIterator:
    """An epoch found to train at its second batch (Recorder.probation): timed from its
    first, `first` (asked, arrived, the batch)."""
    rec.start_epoch(loader)
    it = TimedIterator(rec.probe, rec.epoch, lambda: rest, t_start=first[0])
    it.begun(*first)
    rec.note_workers(loader, rest)
    rec.open = it
    return it


PROBATION = -1.0  # _plan: untimed until the epoch's second batch (NOTE [the model's mode])
WATCHED = -2.0  # _plan: not timed, its waits watched (NOTE [an untimed loader's stall])


def _plan(rec: Recorder, loader: Any, explicit: bool, caller: Any) -> float | None:
    """Whether to time this iter(loader): its start time, None to pass it through,
    PROBATION, or WATCHED (not timed: a validation loader, an evaluation pass)."""
    if rec.is_broken(loader):
        return None
    if not explicit and not on_training_thread(rec.loop_thread):
        if rec.loader_id is not None or not is_dataloader(loader):
            rec.skip(loader, f"iterated by thread {threading.current_thread().name!r}, not "
                             "the training loop's: its waits are not the loop's")
            return None
        # no loader timed yet, and the main thread iterates none: this thread's loop is
        # the training loop (Ray Train's TrainingThread)
        rec.loop_thread = threading.get_ident()
    if rec.inside_timed(loader):  # a stage of the timed loader (WebLoader, CombinedLoader)
        return None
    rec.end_open_step()
    if not explicit:
        role, why = loop_role(caller)
        if role == EVAL or not rec.should_follow(loader, role):
            rec.skip(loader, why if role == EVAL else
                     "a later loader of a plain loop (validation?); the first one is timed")
            return WATCHED
        if rec.on_probation(loader, role):  # NOTE [the model's mode] (probe/choice.py)
            return PROBATION
        if not rec.timed(loader):
            rec.follow(loader, role, why)
        elif rec.evaluation_pass(loader):
            return WATCHED
    elif not rec.timed(loader):
        rec.follow(loader, None, "watch()")
    t0 = rec.probe.clock()
    rec.start_epoch(loader)
    return t0


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


def _outermost(loader: Any, wrapper: Any) -> bool:
    """Whether `wrapper` is the __iter__ that iter(loader) calls first: the loader's class's
    own (patched), or an override the patch could not wrap (then the base times it)."""
    first = getattr(type(loader), "__iter__", None)
    return first is wrapper or not hasattr(first, "_starvation_wrapper")


def _patch_class(cls: Any) -> None:
    """Wrap the __iter__ a class defines itself (DataLoader, and subclasses that replace it,
    such as torchdata's StatefulDataLoader)."""
    if "__iter__" not in cls.__dict__ or "_starvation_orig_iter" in cls.__dict__:
        return
    orig = cls.__dict__["__iter__"]

    def __iter__(self: Any) -> Any:
        # a subclass's own __iter__ is the one timed; this one, reached from it (or from its
        # __init__), passes through (NOTE [fail-safe probe])
        if id(self) in _busy.__dict__.get("ids", ()) or not _outermost(self, __iter__):
            return orig(self)
        return timed_iter(self, orig)

    __iter__._starvation_wrapper = True  # type: ignore[attr-defined]
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


def _patch_outer(cls: Any, when: Any = None) -> None:
    """Time a loader that wraps DataLoaders at its own __iter__ (the loop iterates it; the
    DataLoaders it iterates inside are its stages: Probe's nested rule passes them through).
    `when(loader)`: whether this instance is timed here (else its DataLoader is)."""
    if "_starvation_orig_iter" in cls.__dict__:
        return
    orig = cls.__iter__

    def __iter__(self: Any) -> Any:
        if id(self) in _busy.__dict__.get("ids", ()) or not _outermost(self, __iter__):
            return orig(self)
        try:
            timed = when is None or when(self)
        except Exception:
            timed = False
        return timed_iter(self, orig) if timed else orig(self)

    __iter__._starvation_wrapper = True  # type: ignore[attr-defined]
    cls._starvation_orig_iter = orig
    cls.__iter__ = __iter__


def _several(loader: Any) -> bool:
    return len(getattr(loader, "flattened", None) or ()) > 1


# The modules whose loaders the probe times, patched as the script imports them: torch's
# DataLoader (and its subclasses); webdataset's WebLoader (its stages after the DataLoader
# run in the main process, inside the loop's wait); Lightning's CombinedLoader when it
# combines several training loaders (with one, that DataLoader is timed, as before).
def _patch_webdataset(module: Any) -> None:
    _patch_outer(module.WebLoader)


def _patch_combined(module: Any) -> None:
    _patch_outer(module.CombinedLoader, when=_several)


def _patch_fastai(module: Any) -> None:
    """fastai: its DataLoader is no torch DataLoader (it drives torch's loader iterators
    itself, over a _FakeLoader): timed at its own __iter__, a loader kind of its own
    (monitor/probe/loaders.py fastai_settings)."""
    _patch_outer(module.DataLoader)


def _patch_nodes(module: Any) -> None:
    """torchdata.nodes: its Loader drives the nodes (a ParallelMapper's worker threads or
    processes, a Batcher, a Prefetcher), no torch DataLoader inside: timed at its __iter__
    as a loader kind of its own (monitor/probe/loaders.py nodes_settings)."""
    _patch_outer(module.Loader)


TARGETS = {
    "torch.utils.data.dataloader": _patch,
    "webdataset.compat": _patch_webdataset,
    "lightning.pytorch.utilities.combined_loader": _patch_combined,
    "pytorch_lightning.utilities.combined_loader": _patch_combined,
    "torchdata.nodes.loader": _patch_nodes,
    "fastai.data.load": _patch_fastai,
}


def _patch_safely(name: str, module: Any) -> None:
    try:
        TARGETS[name](module)
    except Exception as exc:  # another version's layout: that loader goes untimed
        _say_once(name, f"could not patch {name} ({exc!r}); its loaders are not timed")


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the TARGETS modules right after the script imports each."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch_safely(name, module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def _forking() -> None:
    _forker[0] = os.getpid()


def _forked() -> None:
    """In a child just forked: a DataLoader worker (forked inside a loader's own __iter__)
    dies with the process that forked it (NOTE [bound to monitor run], 2)."""
    if getattr(_busy, "ids", None):
        with contextlib.suppress(Exception):
            bind_to_parent(_forker[0])


_forker = [0]


def finder() -> _Finder:
    """The probe's finder in sys.meta_path (install() puts it there)."""
    return next(f for f in sys.meta_path if isinstance(f, _Finder))


def install() -> None:
    """Patch the loaders already imported now, the others when the script imports them;
    under `monitor run`, bind the loaders' workers to the script's life."""
    if os.environ.get(RELAY_ENV) and not _forker[0]:
        _forker[0] = os.getpid()
        os.register_at_fork(before=_forking, after_in_child=_forked)
    for name in TARGETS:
        mod = sys.modules.get(name)
        if mod is not None:
            _patch_safely(name, mod)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
