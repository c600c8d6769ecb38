"""One-line adapters for scripts that `monitor run` cannot wrap (launched by a scheduler, a
notebook): a Lightning `Callback`, a Hugging Face `TrainerCallback` and a fastai `Callback`
that install the same
probe, so the same steps go to the same store as under zero-line attach (the run named by
$STARVATION_MONITOR_RUN_ID under `monitor run`, else a new run in $STARVATION_MONITOR_DB or
runs/monitor.db). Under Lightning the callback also ends each step at the framework's own
batch end, so an epoch's last step needs no later next().

    trainer = lightning.Trainer(callbacks=[monitor.lightning_callback()])
    trainer = transformers.Trainer(..., callbacks=[monitor.hf_callback()])
    learn = Learner(dls, model, cbs=[monitor.fastai_callback()])

The frameworks are imported when an adapter is asked for, never at import of this module
(the probe's fence: the standard library and torch only).
"""
from __future__ import annotations

from typing import Any

from monitor.probe.patch import install, recorder


def _start(name: str | None) -> None:
    install()
    recorder(name)


def lightning_callback(name: str | None = None) -> Any:
    """A `lightning.pytorch.Callback` (or `pytorch_lightning.Callback`) instance."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class StarvationMonitor(Callback):  # type: ignore[misc, valid-type]
        """Times the fit loop's training loader into the store."""

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            _start(name)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            recorder().end_open_step()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            recorder().end_open_step()

    return StarvationMonitor()


def hf_callback(name: str | None = None) -> Any:
    """A `transformers.TrainerCallback` instance."""
    from transformers import TrainerCallback

    class StarvationMonitor(TrainerCallback):  # type: ignore[misc, valid-type]
        """Times the Trainer's train dataloader into the store."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _start(name)

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            recorder().end_open_step()

    return StarvationMonitor()


def fastai_callback(name: str | None = None) -> Any:
    """A `fastai.callback.core.Callback` instance: the probe installed at `before_fit`
    (fastai's DataLoader is timed at its own __iter__, `Learner._do_epoch_train`'s the
    training loader), each epoch's last step ended at `after_train`, before validation."""
    from fastai.callback.core import Callback

    class StarvationMonitor(Callback):  # type: ignore[misc, valid-type]
        """Times Learner.fit's training loader into the store."""

        def before_fit(self) -> None:
            _start(name)

        def after_train(self) -> None:
            recorder().end_open_step()

    return StarvationMonitor()
