"""The probe inside a user's own training script.

Two ways in, one recorder:
- `python -m monitor run -- python train.py ARGS...` starts the script unmodified with
  `monitor/_inject` first on PYTHONPATH; its `sitecustomize` calls `install()`, which patches
  `DataLoader.__iter__` as soon as the script imports torch. The first DataLoader the script
  iterates (the training loader in the usual loop) is timed; others pass through untouched.
- `from monitor import watch; for batch in watch(loader): ...` does the same explicitly.

Per step it records the data wait (blocked in `next()`) and the compute (from the batch's
arrival to the next `next()`), per epoch (`iter()` call) the DataLoader's worker PIDs. At each
epoch start it applies loader changes requested through the store's control table
(num_workers, prefetch_factor, pin_memory, persistent_workers) and records when (or, under
`--autotune-every-steps N`, at a step boundary: monitor/timed.py); settings a
DataLoader fixes at construction (batch_size, sampler, ...) are refused with the reason.

Only the standard library and monitor's store/records are imported here: the user's
environment needs sqlite3, nothing else of ours.
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from monitor.config import ATTACHED_PREFIX, ConfigError, LoaderConfig, describe_change
from monitor.identity import accelerator_kind, cuda_device, job_key, rank_identity
from monitor.probe import Probe
from monitor.store import Store
from monitor.timed import TimedIterator, every_steps, why_not_resumable
from monitor.watchdog import Watchdog

RUN_ENV = "STARVATION_MONITOR_RUN_ID"
DB_ENV = "STARVATION_MONITOR_DB"
FIXED_SETTINGS = ("batch_size", "drop_last", "sampler", "batch_sampler", "dataset",
                  "collate_fn", "shuffle")
FLUSH_S = 0.5
AWAIT_TUNER_S = 2.0  # the longest an epoch start waits for a searching autotuner


def loader_settings(loader: Any) -> dict[str, Any]:
    nw = int(getattr(loader, "num_workers", 0))
    return {
        "preset": "custom", "num_workers": nw,
        "batch_size": getattr(loader, "batch_size", None) or 1,
        "prefetch_factor": getattr(loader, "prefetch_factor", None) if nw > 0 else None,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
    }


class Recorder:
    """One run's epochs and control in a user's process; the steps themselves go through a
    Probe (the same records and batching as the managed workload)."""

    def __init__(self, store: Store, run_id: int, script: str) -> None:
        self.store, self.run_id, self.script = store, run_id, script
        self.rank, self.local_rank, self.world_size = rank_identity()
        self.probe = Probe(store, run_id, flush_interval=FLUSH_S, rank=self.rank)
        self.epoch = -1
        self.last_control = 0
        self.loader_id: int | None = None
        self.lock = threading.Lock()
        self.stopped: str | None = None  # why recording stopped (the training goes on)
        self.said_no_midepoch = False
        self.watchdog = Watchdog(self.probe, on_stall=self._say).start()
        atexit.register(self.close)

    @property
    def config_seq(self) -> int:
        return self.probe.config_seq

    def record(self, t_req: float, t_got: float, t_next: float, batch: Any) -> None:
        if self.stopped:
            return
        with self.lock:
            try:
                self.probe.record(self.epoch, t_req, t_got, t_next, batch)
            except Exception as exc:  # never break the user's training for our records
                self._stop_recording(exc)

    def flush(self) -> None:
        if self.stopped:
            return
        with self.lock:
            try:
                self.probe.flush()
            except Exception as exc:
                self._stop_recording(exc)

    def close(self) -> None:
        self.watchdog.stop()
        self.flush()

    @staticmethod
    def _say(text: str) -> None:
        print(f"starvation-monitor: {text}", file=sys.stderr)

    def _stop_recording(self, exc: Exception) -> None:
        """Say once why recording stopped; the training goes on untouched."""
        self.stopped = str(exc)
        self.probe.discard()
        self.watchdog.stop()
        self._say(f"recording stopped: {exc}. Your training goes on; its steps are no "
                  "longer recorded.")

    # -- epochs and control --------------------------------------------------------------
    def start_epoch(self, loader: Any) -> None:
        """At iter(loader): apply pending loader changes, count the epoch."""
        self.flush()
        self.epoch += 1
        if self.stopped:
            return
        try:
            if self.epoch > 0:
                self._await_tuner()
            self._epoch_control(loader)
        except Exception as exc:  # the store failed: the training goes on without us
            self._stop_recording(exc)

    def _await_tuner(self) -> None:
        """While an autotuner is searching (monitor/tuning/live.py), say the last epoch is
        done and give it up to AWAIT_TUNER_S to judge it, so its next setting lands at this
        epoch, not the one after. One read per epoch when no autotuner is on."""
        key = f"{self.run_id}:{self.rank}"
        if self.store.meta(f"autotune:{self.run_id}") != "on":
            return
        done = self.epoch - 1
        self.store.set_meta(f"epoch_done:{key}", str(done))
        deadline = time.monotonic() + AWAIT_TUNER_S
        pause = threading.Event()
        while time.monotonic() < deadline:
            ack = self.store.meta(f"autotune_ack:{key}")
            if ack is not None and (not ack.lstrip("-").isdigit() or int(ack) >= done):
                return  # judged (or settled: any non-number)
            pause.wait(0.02)

    def _epoch_control(self, loader: Any) -> None:
        if self.epoch == 0:
            settings = loader_settings(loader)
            self._report(settings)
            self.store.add_event(self.run_id, "config", "start", {**settings, "rank": self.rank})
        self._apply_requests(loader)

    def apply_pending(self, loader: Any, at_step: int) -> bool:
        """Mid-epoch (monitor/timed.py): apply pending requests at this step boundary; True
        when the loader's settings changed (its iterator must then be rebuilt)."""
        if self.stopped:
            return False
        seq = self.config_seq
        try:
            self._apply_requests(loader, at_step)
        except Exception as exc:
            self._stop_recording(exc)
        return self.config_seq != seq

    def resumable(self, loader: Any) -> bool:
        """Whether mid-epoch changes can apply to this loader; says why not, once."""
        why = why_not_resumable(loader)
        if why is not None and not self.said_no_midepoch:
            self.said_no_midepoch = True
            self._say(f"mid-epoch changes are off for this loader: {why}")
            if not self.stopped:
                self.store.add_event(self.run_id, "autotune", f"mid-epoch changes off: {why}",
                                     {"rank": self.rank})
        return why is None

    def _apply_requests(self, loader: Any, at_step: int | None = None) -> None:
        reqs = [(cid, kind, payload) for cid, kind, payload in
                self.store.control_after(self.run_id, self.last_control) if _for_me(payload,
                                                                                    self.rank)]
        for i, (cid, kind, payload) in enumerate(reqs):
            self.last_control = cid
            later = _covering(payload, reqs[i + 1:]) if kind == "config" else None
            if later is not None:  # a later request sets every setting this one asks for
                self.store.mark_control(cid, f"superseded by request {later}")
                continue
            if kind != "config" or not isinstance(payload, dict):
                self.store.mark_control(cid, f"refused: attached runs take loader settings "
                                             f"only, not {kind!r}")
                continue
            self.store.mark_control(cid, self.apply(loader, payload, at_step))

    def _report(self, settings: dict[str, Any]) -> None:
        """This process's rank, loader settings and accelerator, for the store; rank 0 (or a
        single process) also speaks for the run record."""
        kind = accelerator_kind()
        device = cuda_device()
        self.store.set_rank(self.run_id, self.rank, self.local_rank, self.world_size,
                            socket.gethostname(), os.getpid(), settings, kind, device)
        if self.rank == 0:
            extra: dict[str, Any] = {"pid": os.getpid()} if self.world_size == 1 else {}
            if device is not None:
                extra["device"] = device
            self.store.update_run(self.run_id, config={
                **settings, "workload": f"{ATTACHED_PREFIX}{self.script}"},
                accelerator_kind=kind, accelerator=f"your script's own step ({kind})", **extra)

    def apply(self, loader: Any, payload: dict[str, Any], at_step: int | None = None) -> str:
        """Apply a requested change to the loader before its next iterator is built; the
        request is validated and normalised by LoaderConfig like any other setting."""
        before = loader_settings(loader)
        source = payload.get("source")  # who asked ("autotune: why"), for the marker
        payload = {k: v for k, v in payload.items() if k not in ("rank", "source")}
        fixed = [k for k in FIXED_SETTINGS if k in payload and payload[k] != before.get(k)]
        if fixed:
            return (f"refused: {', '.join(fixed)} cannot change after the DataLoader is built; "
                    "change it in the script")
        try:
            wanted = LoaderConfig.live_request(before, **payload)
        except (ConfigError, TypeError) as exc:
            return f"refused: {exc}"
        change = {k: v for k, v in wanted.items() if v != before.get(k)}
        if not change:
            return "ok: nothing to change"
        old_iter = getattr(loader, "_iterator", None)
        if old_iter is not None:  # persistent workers of the old settings
            getattr(old_iter, "_shutdown_workers", lambda: None)()
            object.__setattr__(loader, "_iterator", None)
        for k, v in change.items():
            # DataLoader forbids setting persistent_workers after __init__ to protect a live
            # persistent iterator; that iterator was shut down just above.
            object.__setattr__(loader, k, v)
        after = loader_settings(loader)
        self.probe.config_seq += 1
        label = describe_change(before, after) or "settings"
        if isinstance(source, str) and source.startswith("autotune"):
            label = f"autotune: {label}"
        where = f"epoch {self.epoch}" + (f", step {at_step}" if at_step else "")
        self.store.add_event(self.run_id, "config", label if self.world_size == 1 else
                             f"rank {self.rank}: {label}",
                             {**after, "applied_at_epoch": self.epoch, "rank": self.rank,
                              "applied_at_step": at_step})
        self._report(after)
        return f"ok: applied at {where}" + (
            f" (rank {self.rank})" if self.world_size > 1 else "")

    def note_workers(self, it: Any) -> None:
        pids = [getattr(w, "pid", None) for w in getattr(it, "_workers", []) or []]
        pids = [p for p in pids if p]
        if pids:
            self.store.add_event(self.run_id, "epoch", f"epoch {self.epoch}",
                                 {"worker_pids": pids})


def _for_me(payload: Any, rank: int) -> bool:
    """A request for every rank (no "rank" key), or for this one."""
    target = payload.get("rank") if isinstance(payload, dict) else None
    return target is None or int(target) == rank


def _covering(payload: Any, later: list[tuple[int, str, Any]]) -> int | None:
    """The id of a later config request that sets every key of `payload`, if any."""
    keys = set(payload) if isinstance(payload, dict) else set()
    for cid, kind, p in later:
        if kind == "config" and isinstance(p, dict) and keys and keys <= set(p):
            return cid
    return None


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


def timed_iter(loader: Any, orig_iter: Any) -> Iterator[Any]:
    rec = recorder()
    if rec.loader_id is None:
        rec.loader_id = id(loader)
    if rec.loader_id != id(loader):
        return orig_iter(loader)  # another loader (validation, say): not ours to time
    t0 = time.perf_counter()
    rec.start_epoch(loader)
    it = TimedIterator(loader, orig_iter, rec, t0, every_steps())
    rec.note_workers(it._inner)
    return it


def watch(loader: Any, name: str | None = None) -> Iterator[Any]:
    """`for batch in watch(loader): ...` times this epoch's steps into the store."""
    rec = recorder(name)
    rec.loader_id = id(loader)
    cls = type(loader)
    orig = getattr(cls, "_starvation_orig_iter", cls.__iter__)
    return timed_iter(loader, orig)


def _patch(module: Any) -> None:
    dl = module.DataLoader
    if getattr(dl, "_starvation_orig_iter", None) is not None:
        return
    orig = dl.__iter__

    def __iter__(self: Any) -> Any:
        try:
            return timed_iter(self, orig)
        except Exception as exc:  # our bug must not stop their training
            print(f"starvation-monitor: probe disabled: {exc}", file=sys.stderr)
            return orig(self)

    dl._starvation_orig_iter = orig
    dl.__iter__ = __iter__


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
