"""One attached run's recorder in a user's process: its epochs, what it reports of the
loader and the rank, and the control requests it applies (monitor/control.py, the
protocol). The steps themselves go through a Probe and the one timing loop
(monitor/probe/timing.py), as in the managed workload.

At each epoch start it applies loader changes requested through the store's control table
(num_workers, prefetch_factor, pin_memory, persistent_workers) and records when (or, under
`--autotune-every-steps N`, at a step boundary: monitor/probe/epoch_plan.py); settings a
DataLoader fixes at construction (batch_size, sampler, ...) are refused with the reason.
"""
from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from typing import Any

from monitor import control
from monitor.config import ATTACHED_PREFIX, ConfigError, LoaderConfig, describe_change
from monitor.probe.epoch_plan import why_not_resumable
from monitor.probe.identity import (
    accelerator_kind,
    cuda_device,
    job_id,
    node_count,
    node_rank,
    rank_identity,
)
from monitor.probe.loops import TRAIN
from monitor.probe.timing import Probe, TimedIterator
from monitor.probe.watchdog import Watchdog
from monitor.store import Store

FIXED_SETTINGS = ("batch_size", "drop_last", "sampler", "batch_sampler", "dataset",
                  "collate_fn", "shuffle")
FLUSH_S = 0.5
AWAIT_TUNER_S = 2.0  # the longest an epoch start waits for a searching autotuner


def is_dataloader(obj: Any) -> bool:
    """A torch DataLoader (or a subclass, or what poses as one: accelerate's shards)."""
    data = sys.modules.get("torch.utils.data")
    dl = getattr(data, "DataLoader", None)
    return dl is not None and isinstance(obj, dl)


def batch_size(loader: Any) -> int | None:
    """The loader's batch size: `batch_size`, else its batch sampler's (accelerate and the
    HF Trainer build loaders with `batch_sampler=`, leaving `batch_size` None)."""
    for obj in (loader, getattr(loader, "batch_sampler", None)):
        bs = getattr(obj, "batch_size", None)
        if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
            return bs
    return None


def describe_loader(loader: Any) -> str:
    """'DataLoader over RandomDataset, batch 32, 0 workers' (for the probe's own events)."""
    ds = getattr(loader, "dataset", None)
    over = f" over {type(ds).__name__}" if ds is not None else ""
    nw = getattr(loader, "num_workers", None)
    return (f"{type(loader).__name__}{over}, batch {batch_size(loader) or '?'}"
            + (f", {nw} workers" if nw is not None else ""))


def loader_settings(loader: Any) -> dict[str, Any]:
    nw = int(getattr(loader, "num_workers", 0) or 0)
    return {
        "preset": "custom", "num_workers": nw,
        "batch_size": batch_size(loader) or 1,
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
        self.probe.on_error = self._stop_recording
        self.epoch = -1
        self.last_control = 0
        self.loader_id: int | None = None  # the loader timed (the training loader)
        self.loader_role: str | None = None  # how it was found (monitor/probe/loops.py)
        self.skipped: set[int] = set()  # loaders seen and not timed (said once each)
        self.open: TimedIterator | None = None  # the timed epoch's iterator
        self.stopped: str | None = None  # why recording stopped (the training goes on)
        self.said_no_midepoch = False
        self.watchdog = Watchdog(self.probe, on_stall=self._say).start()
        atexit.register(self.close)

    @property
    def config_seq(self) -> int:
        return self.probe.config_seq

    def flush(self) -> None:
        """Write the buffered steps; a failed write stops recording (Probe.on_error), never
        the user's training."""
        self.probe.flush()

    def close(self) -> None:
        """At exit: the last step of an epoch that was delivered whole is recorded (a loop
        that stops by length never asks again); a loop left mid-epoch drops its last."""
        it = self.open
        if it is not None and not it.ended and it.complete():
            it.finish()
        self.watchdog.stop()
        self.probe.flush_final()

    # -- which loader is timed -----------------------------------------------------------
    def should_follow(self, loader: Any, role: str | None) -> bool:
        """The loader the probe times: the one the training loop iterates when the loop can
        be told (a new training loader replaces an earlier one), else the first iterated."""
        if self.loader_id is None or self.loader_id == id(loader):
            return True
        return role == TRAIN

    def follow(self, loader: Any, role: str | None, why: str) -> None:
        """Time this loader from now on; say which and why (once, and on a switch to the
        training loader)."""
        first, before = self.loader_id is None, self.loader_role
        self.loader_id, self.loader_role = id(loader), role
        self.skipped.discard(id(loader))
        if not (first or (role == TRAIN and before != TRAIN)):
            return
        what = describe_loader(loader)
        if not is_dataloader(loader):
            text = f"timing {what} ({why}): not a torch DataLoader, only its wait is timed"
        elif role == TRAIN:
            text = f"timing the training loader ({why}): {what}"
        elif why == "watch()":
            text = f"timing {what} (watch())"
        else:
            text = (f"timing {what}: the first DataLoader iterated ({why}); later ones "
                    "(validation) are not timed")
        self._say(text)
        self._event("probe", text)

    def skip(self, loader: Any, why: str) -> None:
        """A loader not timed: said once per loader, in the run's events."""
        if id(loader) in self.skipped or id(loader) == self.loader_id:
            return
        self.skipped.add(id(loader))
        self._event("probe", f"not timed: {describe_loader(loader)}: {why}")

    def end_open_step(self) -> None:
        """Another iter(): the timed epoch's pending step ends now."""
        it = self.open
        if it is not None and not it.ended:
            it.finish()

    def _event(self, kind: str, label: str) -> None:
        if self.stopped:
            return
        try:
            self.store.add_event(self.run_id, kind, label, {"rank": self.rank})
        except Exception as exc:
            self._stop_recording(exc)

    @staticmethod
    def _say(text: str) -> None:
        print(f"starvation-monitor: {text}", file=sys.stderr)

    def _stop_recording(self, exc: Exception) -> None:
        """Say once why recording stopped; the training goes on untouched."""
        self.stopped = str(exc)
        self.probe.stopped = True
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
        if self.store.meta(control.autotune_key(self.run_id)) != control.ON:
            return
        done = self.epoch - 1
        self.store.set_meta(control.epoch_done_key(self.run_id, self.rank),
                            control.epoch_done_value(done, time.time()))
        deadline = time.monotonic() + AWAIT_TUNER_S
        pause = threading.Event()
        while time.monotonic() < deadline:
            if control.acked(self.store.meta(control.ack_key(self.run_id, self.rank)), done):
                return
            pause.wait(0.02)

    def _epoch_control(self, loader: Any) -> None:
        if self.epoch == 0:
            settings = loader_settings(loader)
            self._report(settings)
            self.store.add_event(self.run_id, "config", "start", {**settings, "rank": self.rank})
        self._apply_requests(loader)

    def apply_pending(self, loader: Any, at_step: int) -> bool:
        """Mid-epoch (monitor/probe/epoch_plan.py): apply pending requests at this step
        boundary; True when the loader's settings changed (its iterator must be rebuilt)."""
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
                self.store.control_after(self.run_id, self.last_control)
                if control.for_rank(payload, self.rank)]
        for i, (cid, kind, payload) in enumerate(reqs):
            self.last_control = cid
            later = control.covering(payload, reqs[i + 1:]) if kind == control.CONFIG \
                else None
            if later is not None:  # a later request sets every setting this one asks for
                self.store.mark_control(cid, control.superseded(later))
                continue
            if kind != control.CONFIG or not isinstance(payload, dict):
                self.store.mark_control(cid, control.refused(
                    f"attached runs take loader settings only, not {kind!r}"))
                continue
            self.store.mark_control(cid, self.apply(loader, payload, at_step))

    def _report(self, settings: dict[str, Any]) -> None:
        """This process's rank, loader settings and accelerator, for the store; rank 0 (or a
        single process) also speaks for the run record."""
        kind = accelerator_kind()
        device = cuda_device()
        self.store.set_rank(self.run_id, self.rank, self.local_rank, self.world_size,
                            socket.gethostname(), os.getpid(), settings, kind, device,
                            job_id=job_id(), node_rank=node_rank(), nodes=node_count())
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
        if not is_dataloader(loader):
            return control.refused("not a torch DataLoader: only its wait is timed, its "
                                   "settings are the script's")
        before = loader_settings(loader)
        payload, source, _ = control.split(payload)  # source: who asked, for the marker
        fixed = [k for k in FIXED_SETTINGS if k in payload and payload[k] != before.get(k)]
        if fixed:
            return control.refused(f"{', '.join(fixed)} cannot change after the DataLoader "
                                   "is built; change it in the script")
        try:
            wanted = LoaderConfig.live_request(before, **payload)
        except (ConfigError, TypeError) as exc:
            return control.refused(exc)
        change = {k: v for k, v in wanted.items() if v != before.get(k)}
        if not change:
            return control.ok("nothing to change")
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
        label = control.change_label(describe_change(before, after) or "settings", source)
        where = f"epoch {self.epoch}" + (f", step {at_step}" if at_step else "")
        self.store.add_event(self.run_id, control.CONFIG, label if self.world_size == 1 else
                             f"rank {self.rank}: {label}",
                             {**after, "applied_at_epoch": self.epoch, "rank": self.rank,
                              "applied_at_step": at_step})
        self._report(after)
        return control.ok(f"applied at {where}" + (
            f" (rank {self.rank})" if self.world_size > 1 else ""))

    def note_workers(self, it: Any) -> None:
        pids = [getattr(w, "pid", None) for w in getattr(it, "_workers", []) or []]
        pids = [p for p in pids if p]
        if pids:
            self.store.add_event(self.run_id, "epoch", f"epoch {self.epoch}",
                                 {"worker_pids": pids})
