"""The recorder's side that takes requests from outside the script (the page, the CLI, the
live autotuner: control rows in the store) to the timed loader: at each epoch's start, or
at a step boundary mid-epoch (monitor/probe/epoch_plan.py), applied and answered, and the
settings the run now has reported. A mixin of monitor/probe/recorder.py's Recorder, whose
attributes (store, run_id, rank, probe, epoch, ...) it reads."""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from monitor import control
from monitor.config import attached_config, describe_change
from monitor.probe.epoch_plan import why_not_resumable
from monitor.probe.identity import accelerator_kind, cuda_device, where
from monitor.probe.loaders import change_loader, loader_settings
from monitor.records import CONFIG
from monitor.ring import REPORT

AWAIT_TUNER_S = 2.0  # the longest an epoch start waits for a searching autotuner


class LoaderRequests:
    store: Any
    run_id: int
    rank: int
    local_rank: int | None
    world_size: int
    probe: Any
    epoch: int
    last_control: int
    reported: dict[str, Any]  # the last settings _report sent
    standing: dict[str, Any]  # the settings changed live, by apply()
    said_no_midepoch: bool
    stopped: str | None
    script: str

    def _await_tuner(self) -> None:
        """While an autotuner is searching (monitor/tuning/live.py), say the last epoch is
        done and give it up to AWAIT_TUNER_S to judge it, so its next setting lands at this
        epoch, not the one after. One read per epoch when no autotuner is on."""
        if self.store.meta(control.autotune_key(self.run_id)) != control.ON:
            return
        done = self.epoch - 1
        self.flush()  # the epoch's last steps, before the tuner reads them
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
            self._event(CONFIG, "start", settings)
        self._apply_requests(loader)

    def apply_pending(self, loader: Any, at_step: int) -> bool:
        """Mid-epoch (monitor/probe/epoch_plan.py): apply pending requests at this step
        boundary; True when the loader's settings changed (its iterator must be rebuilt)."""
        if self.stopped:
            return False
        seq = self.probe.config_seq
        try:
            self._apply_requests(loader, at_step)
        except Exception as exc:
            self._stop_recording(exc)
        return self.probe.config_seq != seq

    def resumable(self, loader: Any, inner: Any = None) -> bool:
        """Whether mid-epoch changes can apply to this loader (now); says why not, once."""
        why = why_not_resumable(loader, inner)
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

    def carry_changes(self, loader: Any) -> None:
        """The settings changed live, applied to the training loader the script built again
        (NOTE [a loader built each epoch] in monitor/probe/choice.py): its constructor
        would undo them each epoch, while the store says they hold."""
        if self.standing:
            change_loader(loader, dict(self.standing))

    def _report(self, settings: dict[str, Any]) -> None:
        """This process's rank, loader settings and accelerator, for the store; rank 0 (or a
        single process) also speaks for the run record. Under the relay `monitor run`'s
        process writes them (the training thread never waits on a locked store)."""
        self.reported = settings  # (the timed loader's, at exit where it is gone)
        kind = accelerator_kind()
        device = cuda_device()
        ranks = {"rank": self.rank, "local_rank": self.local_rank, "world_size":
                 self.world_size, "hostname": socket.gethostname(), "pid": os.getpid(),
                 "config": settings, "accelerator_kind": kind, "device": device, **where()}
        run = (self.store.run(self.run_id) or {}) if self.rank != 0 else {}
        record = None
        if self.rank == 0 or "batch_size" not in (run.get("config") or {}):
            # rank 0 speaks for the run; a store holding only other ranks (one `monitor run`
            # per node) takes its lowest rank's settings, so the run is whole there too
            extra: dict[str, Any] = {"pid": os.getpid()} if self.world_size == 1 else {}
            if device is not None:
                extra["device"] = device
            record = {"config": attached_config(self.script, settings),
                      "accelerator_kind": kind,
                      "accelerator": f"your script's own step ({kind})", **extra}
        if self.probe.ring is not None:
            self.probe.ring.event(self.probe.wall(self.probe.clock()), REPORT, "",
                                  {"ranks": ranks, "run": record})
            return
        self.store.set_rank(self.run_id, **ranks)
        if record is not None:
            self.store.update_run(self.run_id, **record)

    def apply(self, loader: Any, payload: dict[str, Any], at_step: int | None = None) -> str:
        """Apply a requested change to the loader before its next iterator is built; the
        request is validated and normalised by LoaderConfig like any other setting."""
        refused, before, after, source = change_loader(loader, payload)
        if refused is not None:
            return refused
        self.probe.config_seq += 1
        self.standing.update({k: v for k, v in after.items() if before.get(k) != v})
        label = control.change_label(describe_change(before, after) or "settings", source)
        where = f"epoch {self.epoch}" + (f", step {at_step}" if at_step else "")
        self.store.add_event(self.run_id, control.CONFIG, label if self.world_size == 1 else
                             f"rank {self.rank}: {label}",
                             {**after, "applied_at_epoch": self.epoch, "rank": self.rank,
                              "applied_at_step": at_step})
        self._report(after)
        return control.ok(f"applied at {where}" + (
            f" (rank {self.rank})" if self.world_size > 1 else ""))
