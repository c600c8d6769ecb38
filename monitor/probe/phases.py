"""Where a step's compute goes, timed from outside the script (no line of it changed): the
forward pass of the outermost module(s) the loop calls, the backward pass, the optimizer's
step; what remains of the step is "other" (the copy to the device, logging, the loop's own
code), derived by the reader.

- Forward: for the first DISCOVER_STEPS steps, torch's global module hooks find the modules
  the training thread calls at depth 0 (the model, a DDP wrapper, a loss module); then those
  global hooks are removed and the roots' classes get a `__call__` that times the roots and
  passes every other instance through, so a 100-layer model pays one wrapper a step, not
  two hundred hooks. Not hooks on the roots themselves: an instance's hooks travel with it,
  and a model saved whole (`torch.save(model)`, as pytorch/examples' word_language_model
  does) then failed to pickle the probe, and an EMA's `deepcopy(model)` copied it.
- Backward: `torch.autograd.backward` wrapped (`Tensor.backward` calls it).
- Optimizer: torch's global optimizer step hooks. A step that runs forward and backward
  inside itself (Lightning's closure) counts only its own time: what the forward and backward
  took while it was open is theirs.

On CUDA, once the script uses it, each phase is device time: every boundary also marks an
event on the training thread's stream (`device`, the probe's DeviceClock, monitor/probe/
device_clock.py: its harvest turns them into the step's phases, never a synchronize); the
kernels a call queues run later, so host time would say little there. Elsewhere (the CPU, the
simulated accelerator) the phases are host time, and the reader labels them so.

Sampled (NOTE [phase sampling]): past discovery, one step in each SAMPLE_S or so of loop is
timed; on the others the roots' wrapper returns at its first test, backward and the optimizer
step are torch's own, and the step stores no phases (None: not measured). A step of 1.5
SAMPLE_S (60 ms) or more is timed every time (NOTE [phase sampling] below).

Every hook body is guarded: an error in one removes them all and says why once (NOTE
[fail-safe probe] in monitor/probe/patch.py); the training is untouched. Standard library
and torch only (the probe's fence).
"""

# NOTE [phase sampling]
# Timed, the phases cost a step 9 to 10 µs of Python (six clock reads, the bookkeeping, the
# device marks: bench/phases_cost.py); a 1 ms step paid near 1%. So past discovery take()
# decides at each step's end whether the next is timed (`armed`): the first step to start
# SAMPLE_S after the last timed one (times a random 0.5 to 1.5: a loop with a period, gradient
# accumulation, is not read at one point of its cycle). A step not timed runs torch's own
# backward and optimizer step (ours are swapped in for a timed step: a module attribute and two
# hook handles, each swap costing the next step 2 to 6 µs), and pays the root's wrapper with
# one test, and take(). The roots' wrapper stays: a class's __call__ replaced made CPython drop
# the code it had specialised on the class (8 µs the next step). Dynamo guards on what it
# traces (the optimizer's hooks, in a compiled optimizer step): once the script asks torch to
# compile anything (compiles()), nothing is swapped again, ours stay in and every wrapper and
# hook tests the flag (a compiled `opt.step` was retraced at each swap: 7 graph breaks for 1).
# The flag is read after the compile check, so dynamo never traces it. A window's shares are
# its timed steps' (monitor/assess/phases.py).

from __future__ import annotations

import os
import random
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from monitor.probe.device_clock import BACKWARD, FORWARD, OPTIMIZER
from monitor.probe.loops import training_mode

ENV = "STARVATION_MONITOR_PHASES"  # "0": phases off (`monitor run --no-phases`)
DISCOVER_STEPS = 3  # steps the global module hooks run before the roots get their own
NOTE_AFTER = 20  # timed steps with backward and no optimizer hook: "not a torch optimizer"
NOTE_AFTER_SAMPLED = 200  # ... where steps were sampled (a 1-in-16 accumulation's optimizer
# step missed by 200 random timed steps: 2.5e-6)
SAMPLE_S = 0.04  # past discovery, one step timed per this much loop (NOTE [phase sampling])
NOT_TIMED = (None, None, None)
# torch.compile warns at each compiled module's call while any global module hook exists
# (ours, for the discovery steps alone): hidden while ours are the reason
COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


def _not_compiling() -> bool:
    return False


_LIVE: weakref.WeakSet[Phases] = weakref.WeakSet()  # for the fork handler below


def _forked() -> None:
    """In a forked child (a DataLoader worker running transforms): the training thread's
    ident is the forking thread's there too, so no thread of the child is ever it."""
    try:
        for ph in list(_LIVE):
            ph.thread = None
    except Exception:  # the child goes on untouched (NOTE [fail-safe probe])
        pass


os.register_at_fork(after_in_child=_forked)

# torch.compiler.is_compiling once installed: True while dynamo traces the code that calls
# it, so a hook that dynamo traces (a module called inside a compiled region, a compiled
# optimizer step) returns at once, with no graph break and nothing timed twice
_compiling: Callable[[], bool] = _not_compiling


class Phases:
    """One per probe; `take()` (the training thread, once a step) returns the step's
    forward, backward and optimizer seconds and starts the next step's."""

    def __init__(self, on_fault: Callable[[str], None],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.on_fault, self.clock = on_fault, clock
        self.thread: int | None = threading.get_ident()  # None in a forked child
        _LIVE.add(self)
        self.fwd = self.bwd = self.opt = 0.0
        self.seen_fwd = self.seen_bwd = self.seen_opt = False
        self._depth, self._t_fwd = 0, 0.0
        self._t_opt, self._inner_at_opt, self._opt_open = 0.0, 0.0, False
        self.roots: dict[int, Any] = {}  # id -> module, found while discovering
        self._global: list[Any] = []  # the global hooks' handles (removed after discovery)
        self._patched: list[tuple[type, Any]] = []  # (root class, its own __call__ or None)
        self._root_ids: frozenset[int] = frozenset()
        self._orig_backward: Any = None
        self._backward: Any = None  # ours (_backward_of), while installed
        self._global_opt: list[Any] = []  # the optimizer hooks' handles (on timed steps)
        self._filter: Any = None  # our entry in warnings.filters, while discovering
        # dynamo traced a module call while our global hooks were on: its guards hold their
        # count, so removing them would recompile the user's model; they stay (the compiled
        # code does not call them, and the eager roots are few)
        self.saw_compile = False
        self.steps = self.timed = 0
        self.armed = True  # this step is timed (NOTE [phase sampling])
        self.sampling = False  # past discovery: one step in SAMPLE_S or so timed
        self._next_at = 0.0  # (this clock) the first step to start after it is timed
        self.swaps = True  # backward and the optimizer hooks swapped in for a timed step only
        self._backends: Any = None  # dynamo's registered backends (compiles()), once loaded
        self._n_backends = 0
        self.failed: str | None = None
        self.note: str | None = None  # said once: the optimizer is not a torch one, ...
        self.on_roots: Callable[[list[str]], None] | None = None  # the roots, once found
        self.trained_mode: bool | None = None  # their training mode then
        # the probe (its waiting_since is set while the loop is inside next(loader)): a
        # module called there is the loader's work (a transform at 0 workers), never a root
        self.source: Any = None
        self.loader_modules: dict[str, None] = {}  # their class names, in order met
        self.device: Any = None  # the probe's DeviceClock: marks each boundary on CUDA

    # -- installing ----------------------------------------------------------------------
    def install(self) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        global _compiling
        try:
            _compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) \
                or _not_compiling
            mod = sys.modules["torch.nn.modules.module"]  # both loaded with torch
            warnings.filterwarnings("ignore", message=COMPILE_WARNING, category=UserWarning)
            self._filter = warnings.filters[0]
            self._global = [mod.register_module_forward_pre_hook(self._pre_any),
                            mod.register_module_forward_hook(self._post_any, always_call=True)]
            self._global_opt = self._hook_optimizers()
            self._orig_backward = torch.autograd.backward
            self._backward = torch.autograd.backward = self._backward_of(self._orig_backward)
        except Exception as exc:  # an older or odd torch: no phases, said once
            self._fail(f"{type(exc).__name__}: {exc}")
            return False
        return True

    def _hook_optimizers(self) -> list[Any]:
        opt = sys.modules["torch.optim.optimizer"]
        return [opt.register_optimizer_step_pre_hook(self._opt_pre),
                opt.register_optimizer_step_post_hook(self._opt_post)]

    def _swap(self, on: bool) -> None:
        """Between two steps, past discovery: the backward and optimizer step as torch's own
        for a step not timed, ours for a timed one (NOTE [phase sampling]). A backward that
        another wrapper replaced after ours is left as it is."""
        try:
            ag = sys.modules["torch"].autograd
            if ag.backward is (self._orig_backward if on else self._backward):
                ag.backward = self._backward if on else self._orig_backward
            if on and not self._global_opt:
                self._global_opt = self._hook_optimizers()
            elif not on:
                for h in self._global_opt:
                    h.remove()
                self._global_opt = []
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")

    def remove(self) -> None:
        for h in [*self._global, *self._global_opt]:
            try:
                h.remove()
            except Exception:
                pass
        for cls, own in self._patched:  # the roots' classes as they were
            try:
                if getattr(cls.__dict__.get("__call__"), "_starvation_phases", False):
                    if own is None:
                        delattr(cls, "__call__")
                    else:
                        cls.__call__ = own
            except Exception:
                pass
        self._global, self._global_opt, self._patched = [], [], []
        self._unfilter()
        self._root_ids = frozenset()
        torch = sys.modules.get("torch")
        if self._orig_backward is not None and torch is not None and \
                getattr(torch.autograd.backward, "_starvation_phases", False):
            torch.autograd.backward = self._orig_backward
        self._orig_backward = None

    def _unfilter(self) -> None:
        """The compile warning shown again: our global hooks are gone."""
        try:
            warnings.filters.remove(self._filter)
            warnings._filters_mutated()  # type: ignore[attr-defined]
        except (AttributeError, ValueError):
            pass

    def _fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            self.remove()
            try:
                self.on_fault(why)
            except Exception:
                pass

    # -- the step ------------------------------------------------------------------------
    def take(self, now: float) -> tuple[float | None, float | None, float | None]:
        """This step's (forward, backward, optimizer) seconds; None for a phase never seen
        in this run, and for a step not timed (not measured, rather than zero). `now`: this
        clock at the step's end (NOTE [phase sampling] decides about the next)."""
        self.steps += 1
        if self.sampling:
            b = self._backends  # (compiles()'s own first test, inline: once a step)
            if self.swaps and (b is None or len(b) != self._n_backends) and self.compiles():
                self.swaps = False  # installed for good from here (NOTE [phase sampling])
                if not self.armed:
                    self._swap(True)
            if now < self._next_at:
                if not self.armed:
                    return NOT_TIMED
                self.armed = False
                if self.swaps:
                    self._swap(False)
            else:
                self._next_at = now + SAMPLE_S * (0.5 + random.random())
                if not self.armed:
                    self.armed = True
                    if self.swaps:
                        self._swap(True)
                    return NOT_TIMED
        out = (self.fwd if self.seen_fwd else None, self.bwd if self.seen_bwd else None,
               self.opt if self.seen_opt else None)
        self.fwd = self.bwd = self.opt = 0.0
        self._depth = 0  # a forward that raised never closed: the next step starts clean
        self._opt_open = False
        self.timed += 1
        if self.timed == (NOTE_AFTER if self.timed == self.steps else NOTE_AFTER_SAMPLED) \
                and self.seen_bwd and not self.seen_opt:
            self.note = ("the optimizer step is not a torch.optim.Optimizer's (no step hook "
                         "ran): its time is counted in other")
        if self.steps == DISCOVER_STEPS:
            self.trained_mode = training_mode(self.roots.values())  # (probe/choice.py)
            if self._global and not self.saw_compile:
                self._time_roots()
            self.sampling = self.failed is None
            self.swaps = not self.saw_compile
        return out

    def compiles(self) -> bool:
        """Whether the script has asked torch to compile: a backend registered with dynamo
        (its eval_frame.cached_backends; None there is a `disable` context's). True where
        that cannot be read (a torch that keeps it elsewhere: nothing is swapped)."""
        b = self._backends
        if b is None:
            ef = sys.modules.get("torch._dynamo.eval_frame")
            if ef is None:
                return False  # dynamo not loaded: nothing compiled
            b = self._backends = getattr(ef, "cached_backends", None)
            if not isinstance(b, dict):
                return True
        if len(b) == self._n_backends:
            return False
        self._n_backends = len(b)
        return any(callable(v) for v in list(b.values()))

    def _time_roots(self) -> None:
        """Discovery is over: the roots' classes time the roots (_timed_call), the global
        hooks go."""
        try:
            self._root_ids = frozenset(self.roots)
            for cls in {type(m) for m in self.roots.values()}:
                own = cls.__dict__.get("__call__")
                cls.__call__ = self._timed_call(cls.__call__)
                self._patched.append((cls, own))
            for h in self._global:
                h.remove()
            self._global = []
            self._unfilter()
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        if self.on_roots is not None:
            try:
                self.on_roots([type(m).__name__ for m in self.roots.values()])
            except Exception:
                pass

    # -- the hooks (each guarded: nothing reaches the loop) ------------------------------
    def _pre_any(self, module: Any, args: Any) -> None:
        if _compiling():
            self.saw_compile = True  # dynamo replays this once its graph runs
            return
        if not self.armed:
            return
        try:
            if threading.get_ident() != self.thread:
                return  # another thread's, or a forked DataLoader worker's transforms
            if self._depth == 0:
                src = self.source
                if src is not None and src.waiting_since is not None:
                    self.loader_modules.setdefault(type(module).__name__)
                    return  # inside next(): the loader's transform, not the forward
                self.roots.setdefault(id(module), module)
                self._t_fwd = self.clock()
                self._mark(FORWARD, False)
            self._depth += 1
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")

    def _post_any(self, module: Any, args: Any, out: Any) -> None:
        if _compiling() or not self.armed:
            return
        try:
            if threading.get_ident() != self.thread or self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self.fwd += self.clock() - self._t_fwd
                self.seen_fwd = True
                self._mark(FORWARD, True)
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")

    def _mark(self, phase: int, end: bool) -> None:
        """The boundary as a CUDA event too, where the script uses CUDA (a comparison a
        boundary elsewhere); the DeviceClock's errors are its own (it gives up, said)."""
        dev = self.device
        if dev is not None and dev.active:
            dev.mark(phase, end)

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if _compiling() or not self.armed or self._opt_open or \
                    threading.get_ident() != self.thread:
                return
            self._opt_open = True
            self._t_opt, self._inner_at_opt = self.clock(), self.fwd + self.bwd
            dev = self.device
            if dev is not None and dev.active:
                dev.mark(OPTIMIZER, False)
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if _compiling() or not self.armed or not self._opt_open or \
                    threading.get_ident() != self.thread:
                return
            self._opt_open = False
            inner = self.fwd + self.bwd - self._inner_at_opt  # a closure's own passes
            self.opt += max(0.0, self.clock() - self._t_opt - inner)
            self.seen_opt = True
            dev = self.device
            if dev is not None and dev.active:
                dev.mark(OPTIMIZER, True)
        except Exception as exc:
            self._fail(f"{type(exc).__name__}: {exc}")

    def _timed_call(self, orig: Any) -> Any:
        """A root class's __call__: a root called on the training thread is timed as its
        forward; every other instance of the class passes through. The hot path of the
        phases (each step's forward): one identity test, one compile check, the clock."""
        phases, clock, get_ident = self, self.clock, threading.get_ident

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            # the compile check first: dynamo traces no line of ours after it (a thread id
            # read in traced code broke the graph)
            if _compiling() or not phases.armed or id(module) not in phases._root_ids \
                    or get_ident() != phases.thread:
                return orig(module, *args, **kwargs)
            outer = phases._depth == 0  # (a root inside a root's forward: the outer times)
            phases._depth += 1
            t = clock() if outer else 0.0
            dev = phases.device
            if outer and dev is not None and dev.active:
                phases._mark(FORWARD, False)
            try:
                return orig(module, *args, **kwargs)  # the user's errors pass untouched
            finally:
                try:
                    phases._depth = max(0, phases._depth - 1)
                    if outer:
                        phases.fwd += clock() - t
                        phases.seen_fwd = True
                        if dev is not None and dev.active:
                            phases._mark(FORWARD, True)
                except Exception as exc:
                    phases._fail(f"{type(exc).__name__}: {exc}")

        __call__._starvation_phases = True  # type: ignore[attr-defined]
        __call__.__wrapped__ = orig  # type: ignore[attr-defined]
        return __call__

    def _backward_of(self, orig: Any) -> Any:
        phases = self

        clock, get_ident = self.clock, threading.get_ident

        def backward(*args: Any, **kwargs: Any) -> Any:
            if _compiling() or not phases.armed or get_ident() != phases.thread or \
                    phases.failed is not None:
                return orig(*args, **kwargs)
            t = clock()
            dev = phases.device
            if dev is not None and dev.active:
                phases._mark(BACKWARD, False)
            try:
                return orig(*args, **kwargs)  # the user's errors pass untouched
            finally:
                phases.bwd += clock() - t
                phases.seen_bwd = True
                if dev is not None and dev.active:
                    phases._mark(BACKWARD, True)

        backward._starvation_phases = True  # type: ignore[attr-defined]
        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        backward.__doc__ = getattr(orig, "__doc__", None)
        return backward
