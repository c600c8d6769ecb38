"""Which loader the recorder times: the training loop's (monitor/probe/loops.py), else the
first a plain loop iterates; a later one replaces it when it is the training loader built
again (NOTE [a loader built each epoch]); an evaluation pass over it is counted apart; the
loaders not timed said once each. A mixin of monitor/probe/recorder.py's Recorder, whose
attributes (loader_id, trained, epoch, ...) it reads."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from monitor.probe.loaders import (
    base_loader,
    batches_itself,
    describe_loader,
    is_fastai_loader,
    is_nodes_loader,
    not_retunable,
    shipped,
    weakly,
)
from monitor.probe.loops import TRAIN, training_mode
from monitor.records import EVALUATION, PROBE


def grad_enabled() -> bool:
    """Whether autograd records here (False under no_grad and inference_mode); True where
    torch cannot say."""
    torch = sys.modules.get("torch")  # (the script's own: the probe never imports it)
    try:
        return bool(torch.is_grad_enabled()) if torch is not None else True
    except Exception:
        return True


# NOTE [a loader built each epoch]
# A plain loop's training loader is the first iterated; later ones are validation's
# (a test loader, an evaluation pass), not timed. A script that builds its DataLoader
# inside the epoch loop iterates a new loader each epoch, and only the first epoch was
# timed: 20 of 160 steps, "warm-up, 1,382 samples/s" for a run that made 76 (2 workers,
# spawn, a 40 MB dataset, persistent_workers=True, which keeps a loader's workers, not
# a new loader's: 16.75 s bare against 2.39 s with the loader built once). A later loader
# over the dataset object the timed one read (or, the timed loader gone, over a dataset of
# its class and length: the dataset built again too), iterated with gradients on after the
# timed one trained, is that training loader built again (not a torchdata.nodes pipeline's:
# its map function is no dataset, and a validation pipeline may share it): it is timed
# from then on, the settings changed live are applied to it too (the script's constructor
# would otherwise undo them each epoch), and its report says so (`built_again`, `built_by`), for the
# workers' start-up finding (monitor/diagnosis/costs.py). A framework's training loop that
# builds its loader again (Lightning's reload_dataloaders_every_n_epochs) is followed as
# before, and its new loaders take the live changes too. A validation loader reads another
# dataset, or runs with gradients off, or with the model in eval mode (NOTE [the model's
# mode]).
def _kind(data: Any) -> tuple[str, int | None] | None:
    """A dataset's class and length (None where it has none): what a dataset built again
    each epoch keeps."""
    if data is None:
        return None
    try:
        size: int | None = len(data)
    except Exception:  # an IterableDataset, or a length that fails
        size = None
    return type(data).__qualname__, size


# NOTE [the model's mode]
# model.eval() without no_grad (a common omission) before a pass over the training loader:
# a 3-epoch run stored 9 "epochs" and read epoch-stall (tests/scripts/loaders.py eval_pass).
# The mode is read from the model's outermost modules that hold parameters (found by
# monitor/probe/phases.py; their mode while training is read at the end of that discovery,
# a compiled model's too), and only where they trained in training mode:
# a script that trains in eval mode (a frozen BatchNorm through model.eval()) keeps the
# gradients' word alone. A plain loop's pass begun in eval mode is not timed until its
# second batch is asked for: the model still in eval mode, it is an evaluation; put back in
# training mode by the loop's step (model.train() inside a train_step, as the HF Trainer
# does after its evaluation), it is a training epoch, timed from its first batch (its ask
# and arrival kept), and the mode is not read again for that script. Deciding at iter()
# alone lost every later epoch of such a script (tests/scripts/loaders.py train_in_step).
# Frameworks' loops say their role and are not read this way.
class LoaderChoice:
    loader_id: int | None
    loader_role: str | None
    loader_cls: str | None
    fixed: str | None
    trained: bool
    eval_passes: int
    epoch: int
    skipped: set[int]
    batchless: bool
    probe: Any
    built: int  # training loaders built again, followed (NOTE [a loader built each epoch])
    built_by: str | None  # ... by which loop (loops.loop_role's words)
    mode_in_step: bool  # the script's step sets the model's mode (NOTE [the model's mode])
    fault: Callable[..., None]
    _timed: Callable[[], Any]
    _timed_data: Callable[[], Any]  # what the timed loader's workers receive (its dataset)
    _timed_kind: tuple[str, int | None] | None  # ... its class and length

    def should_follow(self, loader: Any, role: str | None) -> bool:
        """The loader the probe times: the one the training loop iterates when the loop can
        be told (a new training loader replaces an earlier one), else the first iterated, or
        the training loader built again (NOTE [a loader built each epoch])."""
        if self.loader_id is None or self.timed(loader):
            return True
        return role == TRAIN or self.built_again(loader, role)

    def timed(self, loader: Any) -> bool:
        """Whether `loader` is the one timed: its id, and the object itself (a loader made
        where a dropped one was can have its id)."""
        return self.loader_id == id(loader) and self._timed() is loader

    def built_again(self, loader: Any, role: str | None) -> bool:
        """A plain loop's training loader built again: a new loader, iterated with gradients
        on after the timed one trained, over the timed one's dataset object, or, the timed
        loader gone, over a dataset of its kind and size (built again too)."""
        if role is not None or self.loader_role is not None or not self.trained or \
                not grad_enabled() or is_nodes_loader(loader):
            return False  # (a nodes pipeline's map function is no dataset: a validation
            # pipeline may share it)
        data = shipped(loader)
        kind = _kind(data)
        return data is not None and (data is self._timed_data() or (
            self._timed() is None and kind is not None and kind[1] is not None and
            kind == self._timed_kind))

    def follow(self, loader: Any, role: str | None, why: str) -> None:
        """Time this loader from now on; say which and why (once, and on a switch to the
        training loader)."""
        first, before = self.loader_id is None, self.loader_role
        # (a framework's loop that builds its training loader again: Lightning's
        # reload_dataloaders_every_n_epochs)
        again = not first and (self.built_again(loader, role) or
                               role == TRAIN and before == TRAIN)
        self.loader_id, self.loader_role = id(loader), role
        self.loader_cls = type(loader).__name__
        self._timed, self.batchless = weakly(loader), batches_itself(loader)
        data = shipped(loader)
        self._timed_data = weakly(data) if data is not None else (lambda: None)
        self._timed_kind = _kind(data)
        self.skipped.discard(id(loader))
        self.fixed = None
        self._check_retunable(loader)
        if again:
            self.built, self.built_by = self.built + 1, why
            self.carry_changes(loader)
            if self.built == 1:
                text = (f"the training loader is built again ({why}: a new "
                        f"{type(loader).__name__} over the same data): each one is timed, "
                        "and settings changed live are applied to each")
                self._say(text)
                self._event(PROBE, text)
            return
        if not (first or (role == TRAIN and before != TRAIN)):
            return
        what = describe_loader(loader)
        if is_nodes_loader(loader):
            text = (f"timing {what} ({why}): its settings read from its nodes; they change "
                    "in the script")
        elif is_fastai_loader(loader):
            text = f"timing the training loader ({why}): {what}"
        elif base_loader(loader) is None:
            text = f"timing {what} ({why}): not a torch DataLoader, only its wait is timed"
        elif role == TRAIN:
            text = f"timing the training loader ({why}): {what}"
        elif why == "watch()":
            text = f"timing {what} (watch())"
        else:
            text = (f"timing {what}: the first loader iterated ({why}); later ones "
                    "(validation) are not timed")
        self._say(text)
        self._event(PROBE, text)

    def evaluation_pass(self, loader: Any) -> bool:
        """Whether this iter() of the training loader is an evaluation pass, not training:
        the loop trained on it before (an epoch with gradients on) and iterates it now with
        gradients off (`@torch.no_grad()`, `torch.inference_mode()`), as PyG's mutag_gin
        calls `test(train_loader)` after each `train()`. Counted apart, in its own event,
        and said once; its batches are not training steps, nor its pass an epoch."""
        if not self.timed(loader) or not self.trained or grad_enabled():
            return False
        self._evaluated(loader, "gradients off")
        return True

    def _evaluated(self, loader: Any, how: str) -> None:
        self.eval_passes += 1
        text = (f"evaluation pass over the training loader ({describe_loader(loader)}, "
                f"{how}): not a training epoch, not timed")
        if self.eval_passes == 1:
            self._say(text)
        self._event(EVALUATION, f"{text} ({self.eval_passes} so far)",
                    {"passes": self.eval_passes, "after_epoch": self.epoch})

    def model_in_eval(self) -> bool:
        """The model trained in training mode (its outermost modules when the phases found
        them, during training) and is in eval mode now: model.eval() before a pass that
        leaves gradients on (NOTE [the model's mode]). False where the phases are off or
        found no module with parameters, and once the script's step was seen to set it."""
        ph = self.probe.phases
        return ph is not None and ph.trained_mode is True and not self.mode_in_step and \
            training_mode(ph.roots.values()) is False

    def on_probation(self, loader: Any, role: str | None) -> bool:
        """Whether this iter() of the training loader (or of a new loader over its data)
        waits for its second batch to say whether it trains (NOTE [the model's mode])."""
        return role is None and self.trained and grad_enabled() and \
            (self.timed(loader) or self.built_again(loader, role)) and self.model_in_eval()

    def probation(self, loader: Any, inner: Iterator[Any], t_iter: float,
                  time_rest: Callable[..., Iterator[Any]]) -> Probation:
        return Probation(self, loader, inner, t_iter, time_rest)

    def _resolved(self, loader: Any, training: bool) -> bool:
        if not training:
            if self.timed(loader):
                self._evaluated(loader, "the model in eval mode")
            else:
                self.skip(loader, "a loader over the training data iterated with the model "
                                  "in eval mode (an evaluation)")
            return False
        self.mode_in_step = True
        text = ("the script puts the model in training mode inside its step (model.train() "
                "after the epoch began): its mode no longer tells evaluations apart here")
        self._say(text)
        self._event(PROBE, text)
        if not self.timed(loader):
            self.follow(loader, None, "a plain loop")
        return True

    def skip(self, loader: Any, why: str) -> None:
        """A loader not timed: said once per loader, in the run's events."""
        if id(loader) in self.skipped or id(loader) == self.loader_id:
            return
        self.skipped.add(id(loader))
        self._event(PROBE, f"not timed: {describe_loader(loader)}: {why}")

    def inside_timed(self, loader: Any) -> bool:
        """Whether iter(loader) runs inside the timed loader's own iter() or next(): a stage
        of it (WebLoader's DataLoader, a CombinedLoader's), timed as part of its wait."""
        return (self.probe.waiting_since is not None and self.loader_id is not None
                and self.loader_id != id(loader))

    def end_open_step(self) -> None:
        """Another iter(): the timed epoch's pending step ends now."""
        it = self.open
        if it is not None and not it.ended:
            it.finish()

    def _check_retunable(self, loader: Any) -> None:
        """Say once when requested settings cannot reach the timed loader: read at its
        first iter() and again at each epoch (timm's MultiEpochsDataLoader makes its one
        iterator lazily, at its first batch)."""
        if self.fixed is None:
            self.fixed = not_retunable(loader)
            if self.fixed is not None:
                self._event(PROBE, f"not re-tunable live: {self.fixed}",
                            {"retunable": False, "why": self.fixed})


class Probation:
    """An iterator begun (at `t_iter`) with the model in eval mode and gradients on,
    untimed: an evaluation pass, unless the loop's step puts the model back in training mode
    during the first batch; then the epoch is timed (`time_rest`: the rest, and the first
    batch's times), and the mode is not read again (NOTE [the model's mode]). Its length and
    attributes are the loader's iterator's, as a timed epoch's are."""

    def __init__(self, choice: LoaderChoice, loader: Any, inner: Iterator[Any], t_iter: float,
                 time_rest: Callable[..., Iterator[Any]]) -> None:
        self._choice, self._loader, self._inner = choice, loader, inner
        self._t_iter, self._time_rest = t_iter, time_rest
        self._first: tuple[float, Any] | None = None  # its arrival and the first batch
        self._rest: Iterator[Any] | None = None  # where later batches come from, once known

    def __iter__(self) -> Probation:
        return self

    def __next__(self) -> Any:
        if self._rest is not None:
            return next(self._rest)
        c = self._choice
        if self._first is None:
            try:
                batch = next(self._inner)
            except StopIteration:
                self._rest = self._inner
                c._resolved(self._loader, training=False)
                raise
            self._first = (c.probe.clock(), batch)
            return batch
        (t_got, batch), self._first, self._rest = self._first, None, self._inner
        try:
            if c._resolved(self._loader, training=training_mode(
                    c.probe.phases.roots.values()) is True):
                self._rest = self._time_rest(self._inner, (self._t_iter, t_got, batch))
        except Exception as exc:  # nothing of ours reaches the loop
            c.fault(exc, "at an epoch's second batch", self._loader)
        self._loader = None
        return next(self._rest)

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)
