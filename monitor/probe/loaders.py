"""What the probe reads off the loaders real scripts use: a torch DataLoader, its
subclasses (torchdata's StatefulDataLoader, timm's MultiEpochsDataLoader, which holds one
iterator for every epoch), and loaders built around DataLoaders (webdataset's WebLoader,
Lightning's CombinedLoader), and torchdata.nodes pipelines (a `Loader` over nodes: its
settings read from its ParallelMapper, Batcher, Prefetcher and PinMemory nodes): the
DataLoader whose settings they run on, their batch size,
their settings as the store keeps them, why a requested change cannot reach one, and the
change applied (change_loader).
Standard library only; torch is read from sys.modules (the probe's fence)."""
from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from monitor import control
from monitor.config import SETTINGS, ConfigError, LoaderConfig

FIXED_SETTINGS = ("batch_size", "drop_last", "sampler", "batch_sampler", "dataset",
                  "collate_fn", "shuffle")


def is_dataloader(obj: Any) -> bool:
    """A torch DataLoader (or a subclass, or what poses as one: accelerate's shards)."""
    data = sys.modules.get("torch.utils.data")
    dl = getattr(data, "DataLoader", None)
    return dl is not None and isinstance(obj, dl)


def is_nodes_loader(obj: Any) -> bool:
    """A torchdata.nodes `Loader` (its pipeline is a graph of nodes from `root`)."""
    nodes = sys.modules.get("torchdata.nodes.loader")
    cls = getattr(nodes, "Loader", None)
    return cls is not None and isinstance(obj, cls)


def pipeline_nodes(loader: Any) -> list[Any]:
    """A torchdata.nodes Loader's nodes, from its root down its `source` chain (the first
    source of a node with several)."""
    out, node, seen = [], getattr(loader, "root", None), set()
    while node is not None and id(node) not in seen and len(out) < 64:
        seen.add(id(node))
        out.append(node)
        nxt = getattr(node, "source", None)
        if nxt is None:
            many = getattr(node, "source_nodes", None)
            nxt = next(iter(many.values()), None) if isinstance(many, dict) and many else None
        node = nxt
    return out


def nodes_mapper(loader: Any) -> Any:
    """A torchdata.nodes pipeline's outermost ParallelMapper (its workers), or None."""
    return next((n for n in pipeline_nodes(loader) if type(n).__name__ == "ParallelMapper"),
                None)


def workers_of(loader: Any) -> Any:
    """What holds a loader's worker settings (num_workers, multiprocessing_context): the
    loader itself, or a torchdata.nodes pipeline's ParallelMapper where its method is
    'process' (None for threads: no process starts)."""
    if not is_nodes_loader(loader):
        return loader
    mapper = nodes_mapper(loader)
    return mapper if getattr(mapper, "method", None) == "process" else None


def shipped(loader: Any) -> Any:
    """The object each worker process receives, pickled where it is spawned: a DataLoader's
    dataset; a torchdata.nodes ParallelMapper's map_fn (its source stays in the main
    process, which feeds the workers the items), or the object a bound map_fn holds (a
    dataset's __getitem__: the dataset)."""
    if is_nodes_loader(loader):
        fn = getattr(nodes_mapper(loader), "map_fn", None)
        return fn.__self__ if isinstance(fn, types.MethodType) else fn
    return getattr(loader, "dataset", None)


def nodes_settings(loader: Any) -> dict[str, Any]:
    """A torchdata.nodes pipeline's settings in the store's terms: the (outermost)
    ParallelMapper's num_workers, method and in_order, the Batcher's batch size, the
    Prefetcher's depth, a PinMemory node. It has no persistent_workers: its mapper's
    workers live as long as its iterator."""
    found: dict[str, Any] = {}
    for node in pipeline_nodes(loader):
        kind = type(node).__name__
        if kind == "ParallelMapper" and "num_workers" not in found:
            found.update(num_workers=int(getattr(node, "num_workers", 0) or 0),
                         worker_method=str(getattr(node, "method", "thread")),
                         in_order=bool(getattr(node, "in_order", True)))
        elif kind == "Batcher" and "batch_size" not in found:
            found["batch_size"] = getattr(node, "batch_size", None)
        elif kind == "Prefetcher" and "prefetch_factor" not in found:
            found["prefetch_factor"] = getattr(node, "prefetch_factor", None)
        elif kind == "PinMemory":
            found["pin_memory"] = True
    nw = found.get("num_workers", 0)
    return {"preset": "custom", "loader_kind": "torchdata.nodes", "num_workers": nw,
            "worker_method": found.get("worker_method") if nw else None,
            "batch_size": found.get("batch_size") or 1,
            "prefetch_factor": found.get("prefetch_factor"),
            "pin_memory": bool(found.get("pin_memory")), "persistent_workers": None,
            "in_order": found.get("in_order", True)}


def describe_nodes(loader: Any) -> str:
    """'Loader (torchdata.nodes: ParallelMapper 2 process workers, Batcher 16, ...)'."""
    parts = []
    for node in reversed(pipeline_nodes(loader)):
        kind = type(node).__name__
        if kind == "ParallelMapper":
            parts.append(f"ParallelMapper {getattr(node, 'num_workers', '?')} "
                         f"{getattr(node, 'method', '?')} workers")
        elif kind == "Batcher":
            parts.append(f"Batcher {getattr(node, 'batch_size', '?')}")
        elif kind == "Prefetcher":
            parts.append(f"Prefetcher {getattr(node, 'prefetch_factor', '?')}")
        else:
            parts.append(kind)
    return f"{type(loader).__name__} (torchdata.nodes: {', '.join(parts)})"


def is_fastai_loader(obj: Any) -> bool:
    """A fastai DataLoader (fastai.data.load): not a torch one; its workers are its
    `fake_l`'s (its own `num_workers` reads 1 whatever they are)."""
    load = sys.modules.get("fastai.data.load")
    cls = getattr(load, "DataLoader", None)
    return cls is not None and isinstance(obj, cls)


def fastai_settings(loader: Any) -> dict[str, Any]:
    """A fastai DataLoader's settings in the store's terms: `bs`, and its _FakeLoader's
    workers, pinning, persistence and prefetch (torch's iterators read them there)."""
    bs = getattr(loader, "bs", None)
    return {**read_settings(getattr(loader, "fake_l", None),
                            {"batch_size": bs if isinstance(bs, int) and bs > 0 else 1,
                             "in_order": True}), "loader_kind": "fastai"}


def base_loader(loader: Any) -> Any:
    """The torch DataLoader whose settings a loader runs on: itself, the first stage of a
    webdataset WebLoader, the first of a Lightning CombinedLoader's loaders, the DataLoader
    a wrapper iterates each epoch (Ray Train's `_WrappedDataLoader` keeps it as
    `_dataloader`, copies its attributes, and builds its iterator from it at every
    __iter__: its own settings reach nothing); else None."""
    if is_dataloader(loader):
        inner = vars(loader).get("_dataloader") if hasattr(loader, "__dict__") else None
        return inner if inner is not None and is_dataloader(inner) else loader
    for inner in (getattr(loader, "pipeline", None), getattr(loader, "flattened", None)):
        if isinstance(inner, list) and inner and is_dataloader(inner[0]):
            return inner[0]
    return None


def batches_itself(loader: Any) -> bool:
    """A loader that batches in its dataset (batch_size=None: a WebDataset's `.batched(n)`)
    reports no batch size: the first batch's samples stand for it."""
    base = base_loader(loader)  # never `base or loader`: bool() calls a loader's len()
    return batch_size(base if base is not None else loader) is None


def weakly(obj: Any) -> Callable[[], Any]:
    """`obj` while something else holds it (a weak reference), or `obj` itself where it
    takes none: the probe keeps no loader of the script's alive (NOTE [the loop let go])."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def batch_size(loader: Any) -> int | None:
    """The loader's batch size: `batch_size`, else its batch sampler's (accelerate and the
    HF Trainer build loaders with `batch_sampler=`, leaving `batch_size` None); a
    torchdata.nodes pipeline's Batcher's."""
    if is_nodes_loader(loader):
        bs = nodes_settings(loader)["batch_size"]
        return bs if isinstance(bs, int) and bs > 1 else None
    if is_fastai_loader(loader):
        bs = getattr(loader, "bs", None)
        return bs if isinstance(bs, int) and bs > 0 else None
    for obj in (loader, getattr(loader, "batch_sampler", None)):
        bs = getattr(obj, "batch_size", None)
        if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
            return bs
    return None


def describe_loader(loader: Any) -> str:
    """'DataLoader over RandomDataset, batch 32, 0 workers' (for the probe's own events)."""
    if is_nodes_loader(loader):
        return describe_nodes(loader)
    if is_fastai_loader(loader):
        ds = getattr(loader, "dataset", None)
        fake = getattr(loader, "fake_l", None)
        return (f"{type(loader).__name__} (fastai) over {type(ds).__name__}, batch "
                f"{getattr(loader, 'bs', '?')}, {getattr(fake, 'num_workers', '?')} workers")
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
    """The loader's settings as the store keeps them (those of its base DataLoader; a
    torchdata.nodes pipeline's, from its nodes)."""
    if is_nodes_loader(loader):
        return nodes_settings(loader)
    if is_fastai_loader(loader):
        return fastai_settings(loader)
    loader = base_loader(loader) if base_loader(loader) is not None else loader
    return read_settings(loader, {
        "batch_size": batch_size(loader) or 1,
        # a loader that holds one iterator for every epoch keeps its workers as persistent
        # workers would (timm's MultiEpochsDataLoader)
        "persistent_workers": bool(getattr(loader, "persistent_workers", False))
        or (int(getattr(loader, "num_workers", 0) or 0) > 0
            and held_iterator(loader) is not None)})


def read_settings(obj: Any, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every declared setting (config.SETTINGS) of a DataLoader-like `obj` in the store's
    terms, from its attribute of that name (a setting it lacks, as torch before 2.6 lacks
    in_order: the default), those in `known` as given; worker-only ones at their value
    without workers when it has none."""
    known = known or {}
    nw = int(known.get("num_workers", getattr(obj, "num_workers", 0)) or 0)
    out: dict[str, Any] = {"preset": "custom"}
    for s in SETTINGS:
        if s.worker_only and nw == 0:
            value = s.off
        elif s.name in known:
            value = known[s.name]
        else:
            value = getattr(obj, s.name, s.default)
            value = (bool(value) if s.kind is bool
                     else value if s.name == "prefetch_factor" else int(value or 0))
        out[s.name] = value
    return out


def held_iterator(loader: Any) -> tuple[str, Any] | None:
    """(attribute, iterator) when the loader keeps a DataLoader iterator of its own, made
    once and read every epoch (timm's MultiEpochsDataLoader: `self.iterator`)."""
    base = getattr(sys.modules.get("torch.utils.data.dataloader"), "_BaseDataLoaderIter", None)
    if base is None:
        return None
    for name, value in (getattr(loader, "__dict__", None) or {}).items():  # (a generator:
        if name != "_iterator" and isinstance(value, base):                # none)
            return name, value
    return None


def not_retunable(loader: Any) -> str | None:
    """Why requested loader settings cannot reach this loader (None: at the next epoch)."""
    base = base_loader(loader)
    if is_fastai_loader(loader):
        return None  # its _FakeLoader's settings, read at each epoch's iter()
    if is_nodes_loader(loader):
        return ("a torchdata.nodes pipeline: its settings are its nodes' (ParallelMapper's "
                "num_workers and method, Prefetcher's prefetch_factor), made when the script "
                "built them; change them there")
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
    # ... or this epoch's iterator a wrapper keeps (Ray Train's `dataloader_iter`)
    kept = held_iterator(loader) if base is not loader else None
    workers = (getattr(it, "_workers", None) or getattr(held and held[1], "_workers", [])
               or getattr(own, "_workers", []) or getattr(kept and kept[1], "_workers", []))
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
    outer = loader
    # a WebLoader's settings are its DataLoader's; a fastai DataLoader's, its _FakeLoader's
    # (torch's iterators are built over it at each epoch's iter())
    loader = loader.fake_l if is_fastai_loader(loader) else base_loader(loader)
    before = loader_settings(outer)
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
    return None, before, loader_settings(outer), source
