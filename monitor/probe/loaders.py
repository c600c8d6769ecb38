"""What the probe reads off the loaders real scripts use: a torch DataLoader, its
subclasses (torchdata's StatefulDataLoader, timm's MultiEpochsDataLoader, which holds one
iterator for every epoch), and loaders built around DataLoaders (webdataset's WebLoader,
Lightning's CombinedLoader): the DataLoader whose settings they run on, their batch size,
their settings as the store keeps them, why a requested change cannot reach one, and the
change applied (change_loader).
Standard library only; torch is read from sys.modules (the probe's fence)."""
from __future__ import annotations

import sys
from typing import Any

from monitor import control
from monitor.config import ConfigError, LoaderConfig

FIXED_SETTINGS = ("batch_size", "drop_last", "sampler", "batch_sampler", "dataset",
                  "collate_fn", "shuffle")


def is_dataloader(obj: Any) -> bool:
    """A torch DataLoader (or a subclass, or what poses as one: accelerate's shards)."""
    data = sys.modules.get("torch.utils.data")
    dl = getattr(data, "DataLoader", None)
    return dl is not None and isinstance(obj, dl)


def base_loader(loader: Any) -> Any:
    """The torch DataLoader whose settings a loader runs on: itself, the first stage of a
    webdataset WebLoader, the first of a Lightning CombinedLoader's loaders; else None."""
    if is_dataloader(loader):
        return loader
    for inner in (getattr(loader, "pipeline", None), getattr(loader, "flattened", None)):
        if isinstance(inner, list) and inner and is_dataloader(inner[0]):
            return inner[0]
    return None


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
    base = base_loader(loader)
    of = base if base is not None else loader
    ds = getattr(of, "dataset", None)
    over = f" over {type(ds).__name__}" if ds is not None else ""
    nw = getattr(of, "num_workers", None)
    around = f" around a {type(base).__name__}" if base is not None and base is not loader \
        else ""
    return (f"{type(loader).__name__}{around}{over}, batch {batch_size(of) or '?'}"
            + (f", {nw} workers" if nw is not None else ""))


def loader_settings(loader: Any) -> dict[str, Any]:
    """The loader's settings as the store keeps them (those of its base DataLoader)."""
    loader = base_loader(loader) if base_loader(loader) is not None else loader
    nw = int(getattr(loader, "num_workers", 0) or 0)
    return {
        "preset": "custom", "num_workers": nw,
        "batch_size": batch_size(loader) or 1,
        "prefetch_factor": getattr(loader, "prefetch_factor", None) if nw > 0 else None,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        # a loader that holds one iterator for every epoch keeps its workers as persistent
        # workers would (timm's MultiEpochsDataLoader)
        "persistent_workers": bool(getattr(loader, "persistent_workers", False))
        or (nw > 0 and held_iterator(loader) is not None),
        # torch before 2.6 has no in_order: its loaders are always in order
        "in_order": bool(getattr(loader, "in_order", True)) if nw > 0 else True,
    }


def held_iterator(loader: Any) -> tuple[str, Any] | None:
    """(attribute, iterator) when the loader keeps a DataLoader iterator of its own, made
    once and read every epoch (timm's MultiEpochsDataLoader: `self.iterator`)."""
    base = getattr(sys.modules.get("torch.utils.data.dataloader"), "_BaseDataLoaderIter", None)
    if base is None:
        return None
    for name, value in vars(loader).items():
        if name != "_iterator" and isinstance(value, base):
            return name, value
    return None


def not_retunable(loader: Any) -> str | None:
    """Why requested loader settings cannot reach this loader (None: at the next epoch)."""
    base = base_loader(loader)
    if base is None:
        return ("not a torch DataLoader: only its wait is timed, its settings are the "
                "script's")
    several = len(getattr(loader, "flattened", None) or ())
    if several > 1:
        return (f"{type(loader).__name__} combines {several} training loaders, each with "
                "its own settings: change them in the script (the first one's are shown)")
    held = held_iterator(base)
    if held is not None:
        return (f"{type(loader).__name__} keeps one iterator, made when it was built "
                f"(its attribute {held[0]!r}), for every epoch: its workers and settings "
                "stay as built; change them in the script")
    return None


def worker_procs(loader: Any, it: Any) -> list[Any]:
    """An epoch's DataLoader worker processes: its iterator's, or those of the iterator the
    loader holds across epochs (timm's MultiEpochsDataLoader)."""
    base = base_loader(loader)
    held = held_iterator(base) if base is not None else None
    own = getattr(base, "_iterator", None) if base is not loader else None
    workers = (getattr(it, "_workers", None) or getattr(held and held[1], "_workers", [])
               or getattr(own, "_workers", []))
    return [w for w in workers or [] if getattr(w, "pid", None)]


def change_loader(loader: Any, payload: dict[str, Any]
                  ) -> tuple[str | None, dict[str, Any], dict[str, Any], Any]:
    """A requested change applied to the loader before its next iterator is built, validated
    and normalised by LoaderConfig like any other setting: (None when applied, else the
    control result that refuses it or says there was nothing to change; the settings before;
    after; who asked)."""
    why = not_retunable(loader)
    if why is not None:
        return control.refused(why), {}, {}, None
    loader = base_loader(loader)  # a WebLoader's settings are its DataLoader's
    before = loader_settings(loader)
    payload, source, _ = control.split(payload)  # source: who asked, for the marker
    fixed = [k for k in FIXED_SETTINGS if k in payload and payload[k] != before.get(k)]
    if fixed:
        return control.refused(f"{', '.join(fixed)} cannot change after the DataLoader is "
                               "built; change it in the script"), before, before, source
    try:
        wanted = LoaderConfig.live_request(before, **payload)
    except (ConfigError, TypeError) as exc:
        return control.refused(exc), before, before, source
    change = {k: v for k, v in wanted.items() if v != before.get(k)}
    if "in_order" in change and not hasattr(loader, "in_order"):
        return control.refused("in_order needs torch 2.6 or later (this DataLoader has none); "
                               "a higher prefetch_factor also frees a held queue"), before, \
            before, source
    if not change:
        return control.ok("nothing to change"), before, before, source
    old_iter = getattr(loader, "_iterator", None)
    if old_iter is not None:  # persistent workers of the old settings
        getattr(old_iter, "_shutdown_workers", lambda: None)()
        object.__setattr__(loader, "_iterator", None)
    for k, v in change.items():
        # DataLoader forbids setting persistent_workers after __init__ to protect a live
        # persistent iterator; that iterator was shut down just above.
        object.__setattr__(loader, k, v)
    return None, before, loader_settings(loader), source
