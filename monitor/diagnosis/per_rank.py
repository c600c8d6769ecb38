"""What the ranks of a job on one host hold each (NOTE [a copy per rank]). Pure: the
probe's loader reports by rank, the ranks by host, the host's memory in, a finding out."""

# NOTE [a copy per rank]
# A dataset that loads itself into memory (Ultralytics' cache=True, a preloaded tensor
# dataset, a dict of decoded images) is loaded again by every DDP rank: L ranks on a host
# hold L copies (8 GPUs x 205 GB: ultralytics#22307). The probe weighs what the dataset
# object holds (probe/workers.py held_bytes: its tensors, arrays and bytes, at an epoch's
# first batch, once); ranks on one host (by the hostname each reports) that each hold at
# least CACHE_RANK_MIN_MB of about the same size hold the same data L times. Model weights
# and optimizer state, which each rank needs, are not in the dataset, so they are not
# counted. The fix, one copy per host (a memory-mapped file, shared memory), gives back
# (L - 1) copies: tests/scripts/rank_cache.py measures it bare (the ranks' PSS).
from __future__ import annotations

from typing import Any

from monitor.diagnosis.finding import Advice, Finding
from monitor.thresholds import CACHE_RANK_ALIKE, CACHE_RANK_MIN_MB

CACHE_PER_RANK = "cache-per-rank"


def cache_per_rank(reports: dict[int, dict[str, Any]], local: dict[int, set[int]],
                   mem_total_mb: float | None, limit_mb: float | None) -> Finding | None:
    """The largest group of ranks on one host holding the same in-memory dataset each."""
    best = None
    for ranks in {frozenset(v) for v in local.values() if len(v) >= 2}:
        held = [float((reports.get(r) or {}).get("dataset_held_bytes") or 0) / 1e6
                for r in sorted(ranks)]
        if min(held) < CACHE_RANK_MIN_MB or max(held) > CACHE_RANK_ALIKE * min(held):
            continue
        if best is None or sum(held) > sum(best[1]):
            best = (sorted(ranks), held)
    if best is None:
        return None
    ranks, held = best
    n, each = len(ranks), sum(held) / len(best[1])
    r0 = reports.get(ranks[0]) or {}
    name = f"{r0.get('dataset') or 'the dataset'}.{r0.get('dataset_held_in')}" \
        if r0.get("dataset_held_in") else (r0.get("dataset") or "the dataset")
    of = []
    if limit_mb:
        of.append(f"{n * each / limit_mb:.0%} of the job's memory limit ({limit_mb:,.0f} MB)")
    if mem_total_mb:
        of.append(f"{n * each / mem_total_mb:.0%} of the host's {mem_total_mb:,.0f} MB")
    save = (n - 1) * each
    text = (f"each of the {n} ranks on this host (ranks {', '.join(map(str, ranks))}) holds "
            f"its own {each:,.0f} MB copy of the dataset in memory ({name}): {n} copies, "
            f"{n * each:,.0f} MB" + (f", {' and '.join(of)}" if of else "") +
            f"; one copy per host gives back {save:,.0f} MB")
    fix = Advice("dataset", "one copy per host", None,
                 "load it once per host and share it: a memory-mapped file (numpy.load(..., "
                 "mmap_mode='r'), torch.from_file(..., shared=True)) or a cache written by "
                 f"local rank 0 and mapped by the others: {save:,.0f} MB back, "
                 f"{n - 1} of {n} copies")
    return Finding(CACHE_PER_RANK, text, {"ranks": ranks, "copy_mb": each, "copies": n,
                                          "saving_mb": save}, (fix,), no_more_workers=False)
