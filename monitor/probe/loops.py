"""Which loop is iterating a DataLoader: the training loop, or a validation / prediction loop
that must never take its place (DESIGN.md: training loader).

Read from the call stack at `iter(loader)`, once per epoch: frameworks name their loops in
their own files and functions, so no framework is imported here.
- PyTorch Lightning (`lightning.pytorch` and `pytorch_lightning`): the fit loop
  (`loops/fit_loop.py`, `loops/training_epoch_loop.py`) trains; the evaluation loop
  (sanity check, validation, test: `loops/evaluation_loop.py`) and `loops/prediction_loop.py`
  do not.
- Hugging Face `transformers.Trainer` (accelerate underneath): `_inner_training_loop` trains;
  `evaluate`, `evaluation_loop`, `predict`, `prediction_loop` do not.
- fastai's `Learner` (`fastai/learner.py`): `_do_epoch_train` trains; `_do_epoch_validate`
  (fit's validation, `validate`, `get_preds`) does not.
- Anything else is a plain loop: the first DataLoader iterated is followed (the usual
  `for epoch ...: for batch in train_loader` comes before any validation pass), and the probe
  says so. There the model's mode (`training_mode`) tells an evaluation that leaves gradients
  on (NOTE [the model's mode] in monitor/probe/choice.py).
Standard library only (the user's training process).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any

from monitor.records import LIGHTNING_FIT

TRAIN, EVAL = "train", "eval"
_LIGHTNING = (f"pytorch{os.sep}loops{os.sep}", f"pytorch_lightning{os.sep}loops{os.sep}")
_LIGHTNING_TRAIN = ("fit_loop.py", "training_epoch_loop.py")
_LIGHTNING_EVAL = ("evaluation_loop.py", "prediction_loop.py")
_HF = f"transformers{os.sep}trainer"
_HF_TRAIN = ("_inner_training_loop",)
_HF_EVAL = ("evaluate", "evaluation_loop", "predict", "prediction_loop", "prediction_step")
_FASTAI = f"fastai{os.sep}learner.py"
_FASTAI_TRAIN, _FASTAI_EVAL = ("_do_epoch_train",), ("_do_epoch_validate", "get_preds")
MAX_DEPTH = 60  # frames looked at: a loop's iter() is a few dozen frames below it


def loop_role(frame: Any = None) -> tuple[str | None, str]:
    """(TRAIN, EVAL or None, which loop in words) for the code that is calling iter() now."""
    f = frame if frame is not None else sys._getframe(1)
    for _ in range(MAX_DEPTH):
        if f is None:
            break
        path, name = f.f_code.co_filename, f.f_code.co_name
        if any(p in path for p in _LIGHTNING):
            base = os.path.basename(path)
            if base in _LIGHTNING_EVAL:
                return EVAL, f"Lightning's {base[:-3].replace('_', ' ')} (not training)"
            if base in _LIGHTNING_TRAIN:
                return TRAIN, LIGHTNING_FIT
        elif path.endswith(_FASTAI):
            if name in _FASTAI_EVAL:
                return EVAL, f"fastai's Learner.{name} (not training)"
            if name in _FASTAI_TRAIN:
                return TRAIN, "fastai's Learner.fit"
        elif _HF in path:
            if name in _HF_EVAL:
                return EVAL, f"the Hugging Face Trainer's {name} (not training)"
            if name in _HF_TRAIN:
                return TRAIN, "the Hugging Face Trainer's training loop"
        f = f.f_back
    return None, "a plain loop"


def on_training_thread(loop_thread: int | None = None) -> bool:
    """Whether the caller runs the training loop: the main thread, where training loops
    run, or the thread that iterated the training loader first while the main thread
    iterated none (`loop_thread`: Ray Train runs the train function in its
    `TrainingThread`, the main thread serving Ray's tasks). Any other thread's loader
    (a prefetch thread, a MONAI-style thread loader beside a loop that times its queue)
    blocks that thread, not the training loop, so its next() is no data wait."""
    here = threading.current_thread()
    return here is threading.main_thread() or (loop_thread is not None
                                               and here.ident == loop_thread)


def training_mode(modules: Any) -> bool | None:
    """Whether the model is in training mode: True where one of `modules` (the step's
    outermost, monitor/probe/phases.py) that holds parameters is, False where all such are
    in eval mode (model.eval()), None where none holds any or they cannot be read."""
    try:
        held = [m for m in list(modules) if next(m.parameters(), None) is not None]
        return any(bool(m.training) for m in held) if held else None
    except Exception:
        return None
