"""Host syncs on CUDA, counted on a sample of steps, never by a synchronize of ours: a
`.item()`, `.cpu()`, a Python `if` on a tensor or a pageable `non_blocking` copy makes the
host wait for the device, which then empties its queue and idles until the host queues more.

Standard library only; torch.cuda handed in by the device clock."""
from __future__ import annotations

import os
import re
import warnings
from typing import Any

# NOTE [counting syncs]
# torch says when a synchronizing CUDA call is made in its sync debug mode ("warn"): a
# UserWarning ("called a synchronizing CUDA operation") raised from the line of the script
# that made it. On one step in SYNC_EVERY of a CUDA run (the device clock's steps: it is
# the one per-step path that runs only on CUDA), from the batch's arrival to the next ask,
# that mode is on, the warning let through by a filter of ours put in place (the filters'
# version untouched: a bump shows a script's once-a-place warnings again) and caught by
# a showwarning of ours (each counted by its script line, none shown); before and after,
# the script's own mode, filters and showwarning are back. A script that set a mode of its
# own ("error", to find its syncs) is left to it: nothing is counted. Every REPORT_AFTER
# counted steps make one `syncs` event (the steps counted, the syncs, the lines that made
# the most), which the host-syncs finding reads with the device's utilisation
# (monitor/diagnosis/syncs.py).

SYNC_EVERY = 50  # one step counted in this many
REPORT_AFTER = 8  # counted steps a `syncs` event sums
MESSAGE = "synchronizing CUDA operation"
SITES_KEPT = 5
# torch's sync warnings let through while counting (warnings.filters' own entry form)
FILTER = ("always", re.compile(f".*{MESSAGE}", re.I), Warning, None, 0)


class SyncCount:
    """Counts the host syncs of the steps it is started on; `report` holds one event's data
    when REPORT_AFTER steps were counted (taken by the probe, which writes it)."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.next_at = SYNC_EVERY // 2  # the first counted step: past the first batches
        self.on = False
        self.steps = self.syncs = 0
        self.sites: dict[str, int] = {}
        self.report: dict[str, Any] | None = None
        self.failed: str | None = None
        self._saved: tuple[Any, Any] | None = None  # (showwarning, filters) while counting
        self._mode: Any = None

    def start(self, step: int) -> None:
        """The batch of `step` arrived: count its syncs when it is a sampled step."""
        if step < self.next_at or self.failed is not None:
            return
        self.next_at = step + SYNC_EVERY
        try:
            if self.cuda.get_sync_debug_mode() != 0:  # the script's own mode: left to it
                self.failed = "the script set torch's sync debug mode itself"
                return
            self._saved = (warnings.showwarning, FILTER)
            # in place, the filters' version left as it is: a version bump would show the
            # script's once-a-place warnings again after each counted step
            warnings.filters.insert(0, FILTER)
            warnings.showwarning = self._seen
            self.cuda.set_sync_debug_mode(1)  # "warn"
            self.on = True
        except Exception as exc:  # a torch without the mode: nothing counted, said once
            self._restore()
            self.failed = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        """The loop asks for the next batch: this step's count is in."""
        if not self.on:
            return
        self.on = False
        try:
            self.cuda.set_sync_debug_mode(0)
        except Exception as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
        self._restore()
        self.steps += 1
        if self.steps >= REPORT_AFTER:
            top = sorted(self.sites.items(), key=lambda kv: -kv[1])[:SITES_KEPT]
            self.report = {"steps": self.steps, "syncs": self.syncs,
                           "per_step": self.syncs / self.steps, "sites": dict(top)}
            self.steps = self.syncs = 0
            self.sites = {}

    def _restore(self) -> None:
        if self._saved is not None:
            warnings.showwarning = self._saved[0]
            try:
                warnings.filters.remove(FILTER)
            except ValueError:  # the script reset the filters meanwhile: ours went with them
                pass
            self._saved = None

    def _seen(self, message: Any, category: Any, filename: str, lineno: int,
              file: Any = None, line: Any = None) -> None:
        if MESSAGE in str(message):
            self.syncs += 1
            site = f"{os.path.basename(filename)}:{lineno}"
            self.sites[site] = self.sites.get(site, 0) + 1
            return
        saved = self._saved
        if saved is None:
            return
        # the script's own warnings, shown as they would be: through its showwarning, or,
        # where that is the module's own, the way the module shows one (a recording
        # catch_warnings replaces that way, not showwarning)
        impl = getattr(warnings, "_showwarnmsg_impl", None)  # (private: may go)
        if saved[0] is not getattr(warnings, "_showwarning_orig", None) or impl is None:
            saved[0](message, category, filename, lineno, file, line)
        else:
            impl(warnings.WarningMessage(message, category, filename, lineno, file, line))
