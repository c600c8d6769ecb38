"""A user's own dataset as a managed workload: `path.py:callable` or `package.module:callable`.

The callable returns a `torch.utils.data.Dataset` (map-style or iterable), or a dict with
`dataset` and optionally `collate_fn`, `model_step` (a callable taking a batch: the step the
accelerator would run), `multiprocessing_context`, and defaults for the loader settings
(`batch_size`, `num_workers`, `prefetch_factor`, `pin_memory`, `persistent_workers`).

Every failure becomes a WorkloadError whose message says what is wrong and what to do; the
user's traceback is trimmed to their own frames. `python -m workloads.user --check SPEC`
loads a spec in a throw-away process and prints one JSON line, so the dashboard (which never
imports torch or user code) can show what is wrong before anything starts.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import pickle
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from monitor.config import LOADER_SETTINGS

LOADER_DEFAULTS = LOADER_SETTINGS  # the loader settings a workload may default
DICT_KEYS = {"dataset", "collate_fn", "model_step", "multiprocessing_context",
             *LOADER_DEFAULTS}


class WorkloadError(Exception):
    """A user workload that cannot run; the message is for the user."""


@dataclass(frozen=True, slots=True)
class Spec:
    target: str  # a file path or a module name
    attr: str
    is_file: bool

    def __str__(self) -> str:
        return f"{self.target}:{self.attr}"


def parse_spec(text: str) -> Spec:
    """'path/to/file.py:factory' or 'package.module:factory'."""
    target, sep, attr = (text or "").strip().rpartition(":")
    if not sep or not target or not attr or not attr.replace("_", "a").replace(".", "a").isalnum():
        raise WorkloadError(
            f"workload spec {text!r} is not PATH.py:CALLABLE or package.module:CALLABLE, "
            "e.g. examples/my_data.py:make_dataset")
    is_file = target.endswith(".py") or os.sep in target or "/" in target
    if not is_file and not all(p.isidentifier() for p in target.split(".")):
        raise WorkloadError(f"workload spec {text!r}: {target!r} is neither a .py file nor a "
                            "dotted module name")
    return Spec(target, attr, is_file)


@dataclass
class Workload:
    """What the runner needs from a user workload."""

    spec: str
    dataset: Any
    collate_fn: Any = None
    model_step: Any = None
    multiprocessing_context: Any = None
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def iterable(self) -> bool:
        return isinstance(self.dataset, IterableDataset)

    def describe(self) -> dict[str, Any]:
        d = self.dataset
        try:
            length = len(d)
        except TypeError:
            length = None
        return {"spec": self.spec, "dataset": type(d).__name__,
                "kind": "iterable" if self.iterable else "map-style", "length": length,
                "collate_fn": getattr(self.collate_fn, "__name__", None),
                "model_step": getattr(self.model_step, "__name__", None),
                "defaults": self.defaults}


def _user_frames(exc: BaseException, user_file: str | None) -> str:
    """The traceback without our own and importlib's frames."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = str(Path(__file__).resolve())
    keep = [f for f in frames if str(Path(f.filename).resolve()) != here
            and "importlib" not in f.filename and "<frozen" not in f.filename]
    if user_file:
        mine = [f for f in keep if str(Path(f.filename).resolve()) == user_file]
        keep = keep[keep.index(mine[0]):] if mine else keep
    lines = traceback.format_list(keep) + traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


def _import(spec: Spec) -> Any:
    if spec.is_file:
        path = Path(spec.target).expanduser().resolve()
        if not path.is_file():
            raise WorkloadError(f"workload file not found: {spec.target} (looked at {path}); "
                                "give a path relative to where you started the monitor")
        name = f"user_workload_{path.stem}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise WorkloadError(f"cannot import {path}: not a Python file")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module  # so its classes pickle by reference for spawned workers
        sys.path.insert(0, str(path.parent))
        try:
            mod_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise WorkloadError(f"importing {spec.target} failed:\n"
                                f"{_user_frames(exc, str(path))}") from None
        return module
    try:
        return importlib.import_module(spec.target)
    except ModuleNotFoundError as exc:
        if exc.name and spec.target.startswith(exc.name):
            raise WorkloadError(f"module {spec.target!r} not found: install it, or run from "
                                "the folder that contains it") from None
        raise WorkloadError(f"importing {spec.target} failed:\n{_user_frames(exc, None)}") \
            from None
    except Exception as exc:
        raise WorkloadError(f"importing {spec.target} failed:\n{_user_frames(exc, None)}") \
            from None


def load(text: str) -> Workload:
    """Import the spec, call it, and check what it returned."""
    spec = parse_spec(text)
    module = _import(spec)
    fn: Any = module
    for part in spec.attr.split("."):
        if not hasattr(fn, part):
            names = sorted(n for n in dir(module) if not n.startswith("_")
                           and callable(getattr(module, n)))
            raise WorkloadError(f"{spec.target} has no {spec.attr!r}; callables there: "
                                f"{', '.join(names) or 'none'}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise WorkloadError(f"{spec} is a {type(fn).__name__}, not a callable: name a "
                            "function that returns a Dataset (or a dict with 'dataset')")
    user_file = str(Path(spec.target).resolve()) if spec.is_file else None
    try:
        out = fn()
    except Exception as exc:
        raise WorkloadError(f"calling {spec} failed:\n{_user_frames(exc, user_file)}") \
            from None
    return _normalise(str(spec), out)


def _normalise(spec: str, out: Any) -> Workload:
    if isinstance(out, Dataset) or isinstance(out, IterableDataset):
        return Workload(spec, out)
    if isinstance(out, dict):
        unknown = sorted(set(out) - DICT_KEYS)
        if unknown:
            raise WorkloadError(f"{spec} returned a dict with unknown key(s) {unknown}: "
                                f"allowed are {sorted(DICT_KEYS)}")
        ds = out.get("dataset")
        if not isinstance(ds, (Dataset, IterableDataset)):
            raise WorkloadError(f"{spec} returned a dict whose 'dataset' is "
                                f"{type(ds).__name__}, not a torch.utils.data.Dataset")
        for key in ("collate_fn", "model_step"):
            if out.get(key) is not None and not callable(out[key]):
                raise WorkloadError(f"{spec}: {key!r} must be callable, got "
                                    f"{type(out[key]).__name__}")
        defaults = {k: out[k] for k in LOADER_DEFAULTS if k in out}
        return Workload(spec, ds, out.get("collate_fn"), out.get("model_step"),
                        out.get("multiprocessing_context"), defaults)
    if hasattr(out, "__getitem__") and hasattr(out, "__len__"):
        raise WorkloadError(f"{spec} returned a {type(out).__name__}, which has __getitem__ "
                            "and __len__ but is not a torch.utils.data.Dataset: subclass "
                            "Dataset (or return {'dataset': ...})")
    raise WorkloadError(f"{spec} returned {type(out).__name__}: return a "
                        "torch.utils.data.Dataset, or a dict with a 'dataset' key")


class GuardedDataset(Dataset):
    """Wraps a map-style dataset so an exception in __getitem__ names the index (and,
    through torch's own message, the worker)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.inner[index]
        except Exception as exc:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            where = f"worker {info.id}" if info is not None else "the main process"
            raise WorkloadError(
                f"the dataset raised {type(exc).__name__} for sample index {index} in "
                f"{where}: {exc}\n{_user_frames(exc, None)}") from exc


def pickling_problem(workload: Workload, context: str) -> str | None:
    """Why the dataset cannot be sent to worker processes started with `context`
    ('spawn'/'forkserver' pickle it; 'fork' copies memory and needs nothing), or None."""
    if context == "fork":
        return None
    for name, obj in (("dataset", workload.dataset), ("collate_fn", workload.collate_fn)):
        if obj is None:
            continue
        try:
            pickle.dumps(obj)
        except Exception as exc:
            return (f"the {name} cannot be pickled for worker processes started with "
                    f"{context!r}: {type(exc).__name__}: {exc}. Define it (and what it holds: "
                    "lambdas, open files, locks) at module level, open resources in "
                    "worker_init_fn, or use num_workers=0")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.user",
                                 description="Load a workload spec and report what it is.")
    ap.add_argument("--check", required=True, metavar="SPEC")
    a = ap.parse_args(argv)
    try:
        w = load(a.check)
        print(json.dumps({"ok": True, **w.describe()}, default=str))
        return 0
    except WorkloadError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
