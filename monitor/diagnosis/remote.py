"""Samples read over the network (NOTE [remote reads] in monitor/sampling/sockets.py): the
loaders blocked most of their time, with TCP connections open to a peer and bytes read that
the block device did not serve. Pure: the window's host rows and the time split in."""
from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from monitor.diagnosis.finding import Advice, Finding
from monitor.thresholds import LOADERS_BLOCKED_SHARE, REMOTE_SEEN_SHARE

REMOTE_READS = "remote-reads"


def peers(host: pd.DataFrame) -> list[tuple[str, float]]:
    """Each TCP peer of the loaders and the share of the window's passes it was seen in,
    most seen first."""
    if host.empty or "loaders_peers" not in host.columns:
        return []
    rows = host.drop_duplicates("ts") if "ts" in host.columns else host
    n = len(rows)
    seen: dict[str, int] = {}
    for raw in rows["loaders_peers"].dropna():
        for peer in json.loads(raw):
            seen[peer] = seen.get(peer, 0) + 1
    return sorted(((p, k / n) for p, k in seen.items()), key=lambda x: -x[1]) if n else []


def remote_reads(host: pd.DataFrame, steps: pd.DataFrame, f: Any) -> Finding | None:
    """The loaders wait on the network: blocked at least LOADERS_BLOCKED_SHARE of their
    time (the window's Features `f`), with a TCP peer seen in at least REMOTE_SEEN_SHARE of
    the passes."""
    blocked_share, blocked_per_sample_s = f.loaders_blocked_share, f.blocked_per_sample_s
    num_workers = int(f.config.get("num_workers") or 0)
    if blocked_share is None or blocked_share < LOADERS_BLOCKED_SHARE:
        return None
    found = [p for p in peers(host) if p[1] >= REMOTE_SEEN_SHARE]
    if not found:
        return None
    samples = float(steps["samples"].sum()) if not steps.empty else 0.0
    span = float(steps["ts"].max() - steps["ts"].min()) if len(steps) > 1 else 0.0
    rate = host["loaders_net_kb_s"].dropna().mean() \
        if "loaders_net_kb_s" in host.columns else math.nan
    kb = rate * span / samples if samples > 0 and span > 0 and not math.isnan(rate) else None
    wait = blocked_per_sample_s * 1000 if blocked_per_sample_s is not None else None
    who = "the main process" if num_workers == 0 else f"the {num_workers} workers"
    names = ", ".join(f"{p} (seen in {s:.0%} of the sampler's passes)" for p, s in found[:3])
    text = (f"the loaders read over the network: {who} hold TCP connections to {names} and "
            f"are blocked {blocked_share:.0%} of their time, on no CPU and no disk"
            + (f"; {wait:.1f} ms a sample waits on a remote read" if wait else "")
            # (recv() is not in rchar: only a client that read()s its socket shows its bytes)
            + (f", {kb:,.1f} KB a sample read through sockets" if kb and kb >= 1 else "")
            + ": more loaders than cores overlap the requests' latency, bigger objects a "
            "request (shards, not samples) cut their number, a local cache removes them")
    fix = Advice("dataset", "fewer, bigger requests, or a local cache", None,
                 f"fetch shards of many samples a request from {found[0][0]} (WebDataset, "
                 "MosaicML Streaming) or cache what was fetched on a local disk: each "
                 "request costs a round trip whatever its size")
    return Finding(REMOTE_READS, text, {"peers": [p for p, _ in found],
                                        "blocked_share": blocked_share,
                                        "wait_per_sample_ms": wait, "kb_per_sample": kb},
                   (fix,), leads=True)

