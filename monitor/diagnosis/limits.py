"""The host's limits a loader meets, from the probe's `loader` report and the sampler's memory:
before they fail, what the batches in flight need against /dev/shm and `ulimit -n`; after,
a loader error that reached the loop, named from its message (a worker killed by a signal:
Bus error, /dev/shm; Killed, the OOM killer where the kernel counted its kill, another
process's signal where it counted none; 'received 0 items of ancdata', descriptors; a worker
that died without saying how, with the memory at its limit). Pure; the findings join
monitor/diagnosis/causes.py's.

- /dev/shm: what the batches in flight need (workers x prefetch, plus the one the loop
  holds, x the batch's bytes) against the size and free space of /dev/shm.
- open files: torch's `file_descriptor` sharing holds a descriptor per tensor in flight;
  against `ulimit -n`.
"""
from __future__ import annotations

import re
from typing import Any

import pandas as pd

from monitor.config import prefetch_of
from monitor.diagnosis.finding import Advice, Finding
from monitor.records import OOM_NOTE, oom_counted
from monitor.thresholds import FD_HEADROOM, OOM_ROOM_MB, SHM_HEADROOM

SHM, OPEN_FILES, OOM = "shm-exhausted", "open-files-limit", "oom-killed"
LOADER_ERROR = "loader-error"  # the loader's own exception (a dataset's, a worker's import)
WORKER_KILLED = "worker-killed"  # a worker killed by SIGKILL that the OOM killer did not kill
TOKENIZER_FORK = "tokenizer-after-fork"  # workers deadlocked on a pool forked mid-use


def memory_left(h: pd.DataFrame, least: bool = False) -> tuple[float | None, str,
                                                                 float | None]:
    """(MB left, who runs out, the cgroup's limit) as last sampled (`least`: at the sample
    that left the least, a killed worker's last moment): the host's available memory, or
    the job's cgroup limit less its use where that leaves less (a container is killed at
    its limit, however much the host has)."""
    avail = h["mem_available_mb"].dropna() if "mem_available_mb" in h.columns else h.iloc[0:0]
    host = float(avail.min() if least else avail.iloc[-1]) if not avail.empty else None
    if "cgroup_mem_limit_mb" in h.columns and "cgroup_mem_used_mb" in h.columns:
        room = (h["cgroup_mem_limit_mb"] - h["cgroup_mem_used_mb"]).dropna()
        if not room.empty:
            i = room.idxmin() if least else room.index[-1]
            limit = float(h.at[i, "cgroup_mem_limit_mb"])
            if host is None or room[i] < host:
                return max(0.0, float(room[i])), f"the job's cgroup (limit {limit:,.0f} MB)", \
                    limit
    return host, "the host", None


def _shm_need_mb(report: dict[str, Any]) -> float:
    return report["batch_bytes"] * (int(report.get("in_flight") or 0) + 1) / 1e6


def shm(report: dict[str, Any] | None) -> Finding | None:
    if not report or not report.get("num_workers") or report.get("shm_total_mb") is None:
        return None
    need, total = _shm_need_mb(report), float(report["shm_total_mb"])
    free = float(report.get("shm_free_mb") or total)
    if need <= SHM_HEADROOM * max(free, 0.0):
        return None
    return Finding(SHM, _shm_text(report, need, total, free),
                   {"need_mb": need, "shm_total_mb": total, "shm_free_mb": free},
                   _shm_advice(report, total))


def _shm_text(report: dict[str, Any], need: float, total: float, free: float) -> str:
    batch = report["batch_bytes"] / 1e6
    return (f"the batches in flight need {need:,.0f} MB of /dev/shm ({report['in_flight']} "
            f"in flight ({report['num_workers']} workers x prefetch "
            f"{report.get('prefetch_factor')}) and the one the loop holds, {batch:,.1f} MB "
            f"each); {total:,.0f} MB exist, {free:,.0f} MB free: workers die with 'Bus error' "
            "or 'No space left on device' when it fills")


def _shm_advice(report: dict[str, Any], total: float) -> tuple[Advice, ...]:
    out = []
    batch = report["batch_bytes"] / 1e6
    nw = int(report["num_workers"])
    fits = int((SHM_HEADROOM * total / batch - 1) // nw) if batch > 0 else 0
    pf = prefetch_of(report)
    if 1 <= fits < pf:
        out.append(Advice("prefetch_factor", fits, None,
                          f"prefetch_factor={fits}: {nw * fits + 1} batches fit in "
                          f"{total:,.0f} MB"))
    need = f"at least {_shm_need_mb(report) / SHM_HEADROOM:,.0f} MB" if batch > 0 else \
        "room for the batches in flight"
    out.append(Advice("host", "--shm-size", None,
                      f"give /dev/shm {need} "
                      "(docker run --shm-size=2g; Kubernetes: an emptyDir of medium Memory "
                      "at /dev/shm), or torch.multiprocessing.set_sharing_strategy("
                      "'file_system')"))
    return tuple(out)


def _fd_need(report: dict[str, Any]) -> int:
    return int(report.get("batch_tensors") or 0) * (int(report.get("in_flight") or 0) + 1) \
        + int(report.get("open_fds") or 0)


def open_files(report: dict[str, Any] | None) -> Finding | None:
    if not report or not report.get("num_workers") or not report.get("nofile_limit") \
            or report.get("sharing_strategy") != "file_descriptor":
        return None
    need, limit = _fd_need(report), int(report["nofile_limit"])
    if need <= FD_HEADROOM * limit:
        return None
    return Finding(OPEN_FILES, _fd_text(report, need, limit), {"need": need, "limit": limit},
                   (_fd_advice(need),))


def _fd_text(report: dict[str, Any], need: int, limit: int) -> str:
    return (f"batches in flight hold about {need:,} open descriptors "
            f"({report.get('batch_tensors')} tensors a batch x "
            f"{int(report.get('in_flight') or 0) + 1} batches, and {report.get('open_fds')} "
            f"open already) against ulimit -n {limit:,}: torch's file_descriptor sharing "
            "keeps one per tensor in flight, and past the limit the loop fails with "
            "'received 0 items of ancdata' or 'Too many open files'")


def _fd_advice(need: int) -> Advice:
    return Advice("host", "ulimit -n", None,
                  f"raise the open-files limit above {need * 2:,} (ulimit -n 65536), or call "
                  "torch.multiprocessing.set_sharing_strategy('file_system') before the "
                  "DataLoader is built, or collate each batch into fewer tensors")


def _short(error: str, n: int = 240) -> str:
    """An error line cut to n characters, keeping its end (where a worker's cause is)."""
    return error if len(error) <= n else error[: n // 3] + " ... " + error[-(2 * n) // 3:]


def failure(error: str, report: dict[str, Any] | None,
            host: pd.DataFrame | None = None) -> Finding | None:
    """A loader error that reached the loop, named from its message (None: not one of
    these causes); a killed worker with the memory last sampled (`host`) beside it."""
    low = error.lower()
    if "bus error" in low or "no space left on device" in low or "/dev/shm" in low:
        numbers = report or {}
        total = report.get("shm_total_mb") if report else None
        detail = _shm_text(report, _shm_need_mb(report), float(total),
                           float(report.get("shm_free_mb") or 0)) \
            if total is not None and report.get("batch_bytes") else \
            "the DataLoader workers pass their batches through /dev/shm" + (
                f" ({float(total):,.0f} MB here, {report.get('in_flight')} batches in flight "
                f"from {report.get('num_workers')} workers), and it filled before the "
                "first batch reached the loop" if total is not None else ", and it filled")
        return Finding(SHM, f"the loader failed: /dev/shm ran out ({_short(error)}): {detail}",
                       {k: numbers.get(k) for k in ("shm_total_mb", "shm_free_mb",
                                                     "batch_bytes", "in_flight")},
                       _shm_advice(report, float(report["shm_total_mb"]))
                       if report and report.get("shm_total_mb") else (),
                       no_more_workers=True)  # (a failure that happened leads the verdict)
    if "Open files: " in error:  # the stall watchdog found the loader at the limit
        detail = error[error.index("Open files: ") + len("Open files: "):]
        limit = re.search(r"ulimit -n (\d+)", detail)
        return Finding(OPEN_FILES, f"the loader is stuck at the open-files limit: {detail}",
                       {"limit": int(limit.group(1)) if limit else None},
                       (_fd_advice(int(limit.group(1)) if limit else 1024),),
                       no_more_workers=True)
    if "Tokenizers after fork: " in error:  # the stall watchdog: forked workers, all asleep
        detail = error[error.index("Tokenizers after fork: ") + len("Tokenizers after fork: "):]
        threads = re.search(r"process of (\d+) threads", detail)
        return Finding(TOKENIZER_FORK, f"the loader is deadlocked: {detail}",
                       {"parent_threads": int(threads.group(1)) if threads else None},
                       (Advice("host", "TOKENIZERS_PARALLELISM=false", None,
                               "export TOKENIZERS_PARALLELISM=false (or os.environ[...] = "
                               "'false' before the tokenizer is first used): the forked "
                               "workers then tokenize on their own thread, and deliver"),),
                       no_more_workers=True)
    if "ancdata" in low or "too many open files" in low:
        need = _fd_need(report) if report else None
        detail = _fd_text(report, need, int(report["nofile_limit"])) \
            if report and report.get("nofile_limit") and need is not None else \
            "torch's file_descriptor sharing keeps one descriptor per tensor in flight"
        return Finding(OPEN_FILES, f"the loader failed: out of file descriptors "
                       f"({_short(error)}): {detail}",
                       {"need": need, "limit": (report or {}).get("nofile_limit")},
                       (_fd_advice(need or 1024),))
    killed = "killed by signal: killed" in low
    if killed or _died_unsaid(low):
        return _death(error, killed, host)
    # the loader's own exception (PyG's NeighborLoader without pyg-lib: ImportError in every
    # worker): its words, type, worker and message, are the reason, not the script's exit
    return Finding(LOADER_ERROR, f"the loader failed: {_short(error.strip())}",
                   {"error": error.strip()}, (), no_more_workers=True)


def _death(error: str, killed: bool, host: pd.DataFrame | None) -> Finding | None:
    """A worker killed by SIGKILL, or dead without saying how, judged on the OOM kills the
    kernel counted since the run began (the probe's note in the error: NOTE [who killed the
    worker] in monitor/probe/oom_count.py) and the memory left at the fullest sample."""
    counted = oom_counted(error)
    said = _short(OOM_NOTE.sub("", error))  # (the count is said in this finding's words)
    kills, mine = counted if counted is not None else (None, False)
    where = "" if counted is None else " in the job's cgroup" if mine else " on this host"
    left, what, limit = memory_left(host, least=True) \
        if host is not None and not host.empty else (None, "", None)
    mem = ""
    if left is not None:  # the sample that left the least: the worker's last moment
        mem = (f": {what} had {left:,.0f} MB left at its fullest sample" if limit else
               f": the host had {left:,.0f} MB available at its fullest sample")
    numbers = {"memory_left_mb": left, "cgroup_limit_mb": limit, "oom_kills": kills}
    how = "was killed by SIGKILL" if killed else "died without saying how"
    if kills == 0:  # the kernel killed nothing: a signal another process sent, or a crash
        if not killed:
            return None
        room = f" ({mem[2:]})" if mem else ""
        return Finding(WORKER_KILLED, f"the loader failed: a worker {how} ({said}), and not "
                       f"by the kernel's OOM killer, which killed nothing{where} since the run "
                       f"began{room}: another process sent it (a scheduler's preemption or "
                       "time limit, a watchdog, a user's kill -9), so the loader's settings "
                       "are not what to change", numbers, (), no_more_workers=True)
    if kills:
        text = (f"the loader failed: a worker {how} ({said}), and the kernel's OOM killer "
                f"killed {kills} process{'es' if kills > 1 else ''}{where} since the run "
                f"began{mem}")
        if not mine and left is not None and left >= OOM_ROOM_MB:
            text += (", so perhaps another job's process, not this one's (dmesg says "
                     "'Killed process' with its pid)")  # a host's count, memory to spare
    elif killed:
        text = (f"the loader failed: a worker {how}, most often the kernel's OOM killer when "
                f"memory runs out ({said}){mem}")
    elif left is not None and left < OOM_ROOM_MB:
        text = (f"the loader failed: a worker {how} ({said}){mem}, so most likely the "
                "kernel's OOM killer ended it (dmesg says 'Killed process' with its pid)")
    else:  # a death with memory to spare and no count: not named here
        return None
    return Finding(OOM, text, numbers,
                   (Advice("dataset", "bounded cache, arrays", None,
                           "watch the workers' memory (the worker-memory finding names its "
                           "slope); fewer workers or a bounded cache"),),
                   no_more_workers=True)


def _died_unsaid(low: str) -> bool:
    """A worker's death in the words that do not name its signal: torch's queue timeout
    ("exited unexpectedly"), or a batch cut off mid-send (EOFError, a reset connection)."""
    return "exited unexpectedly" in low or low.startswith(("eoferror", "connectionreseterror")) \
        or "connection reset by peer" in low or "died mid-transfer" in low  # (the managed
    # workload's words for the last two: workloads/runner.py format_error)
