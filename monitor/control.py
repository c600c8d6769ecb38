"""The control protocol: requests to a running loader, through the store's `control` table.

Who writes and who reads:
- The page, the CLI and the live tuner write a request (`request_config`, `request_stop`):
  a kind (CONFIG or STOP) and a payload. A CONFIG payload holds loader settings, plus
  optionally SOURCE (who asked: "autotune: why", for the change's marker) and RANK (one rank
  of a job; without it every rank applies it).
- The managed workload (workloads/runner.py) and the attached probe (monitor/probe/) read the
  requests and mark each with one result: `ok(...)`, `refused(why)`, `superseded(by)` or
  ENDED_FIRST. A request with a later one that sets every key it sets is superseded.
- The autotune handshake (monitor/tuning/live.py with monitor/probe/recorder.py), through the
  store's meta table: the tuner sets `autotune_key(run)` to ON while it searches; a probe at
  an epoch start writes `epoch_done_key(run, rank)` (the epoch finished and when:
  `epoch_done_value`) and waits briefly for `ack_key(run, rank)` to reach that epoch (or
  SETTLED) so the next setting lands at once.

Standard library only: the probe imports this in the user's training process.
"""
from __future__ import annotations

from typing import Any

from monitor.records import CONFIG

STOP = "stop"  # request kinds: CONFIG (the event of that name) and STOP
SOURCE, RANK = "source", "rank"  # payload keys that are not loader settings
AUTOTUNE = "autotune"  # the live tuner's source and event kind
ON, OFF, SETTLED = "on", "off", "settled"

OK = "ok"
ENDED_FIRST = "superseded: the run ended first"


# -- payloads ------------------------------------------------------------------------------
def config_payload(settings: dict[str, Any], source: str | None = None,
                   rank: int | None = None) -> dict[str, Any]:
    """A CONFIG request's payload: the settings, who asked and for which rank."""
    payload = dict(settings)
    if source:
        payload[SOURCE] = source
    if rank is not None:
        payload[RANK] = int(rank)
    return payload


def split(payload: Any) -> tuple[dict[str, Any], str | None, int | None]:
    """(settings, source, rank) of a CONFIG payload (settings empty when it is not a dict)."""
    if not isinstance(payload, dict):
        return {}, None, None
    settings = {k: v for k, v in payload.items() if k not in (SOURCE, RANK)}
    rank = payload.get(RANK)
    return settings, payload.get(SOURCE), int(rank) if rank is not None else None


def for_rank(payload: Any, rank: int) -> bool:
    """A request for every rank (no RANK key), or for this one."""
    return split(payload)[2] in (None, rank)


def covering(payload: Any, later: list[tuple[int, str, Any]]) -> int | None:
    """The id of a later CONFIG request that sets every setting of `payload`, if any."""
    keys = set(split(payload)[0])
    for cid, kind, p in later:
        if kind == CONFIG and keys and keys <= set(split(p)[0]):
            return cid
    return None


# -- sources and labels ----------------------------------------------------------------------
def autotune_source(reason: str) -> str:
    return f"{AUTOTUNE}: {reason}"


def is_autotune(text: Any) -> bool:
    """Whether a source or a config event's label comes from the autotuner."""
    return isinstance(text, str) and text.startswith(AUTOTUNE)


def change_label(label: str, source: str | None) -> str:
    """A config event's label: 'autotune: num_workers 0→2' when the autotuner asked."""
    return f"{AUTOTUNE}: {label}" if is_autotune(source) else label


# -- results --------------------------------------------------------------------------------
def ok(where: str = "") -> str:
    return f"{OK}: {where}" if where else OK


def refused(why: Any) -> str:
    return f"refused: {why}"


def superseded(by: int) -> str:
    return f"superseded by request {by}"


def failed(why: Any) -> str:
    """A request that was applied and then failed (a worker killed, out of memory): the
    loader went back to the last good settings. Counts as refused for whoever asked."""
    return f"refused: the move failed ({why}); back to the last good settings"


def is_refused(result: str | None) -> bool:
    return bool(result) and str(result).startswith("refused")


def reverted_key(run_id: int) -> str:
    """Meta key the managed workload sets when it went back to its last good settings (the
    session manager then takes the run's config as its own: the page's sliders follow)."""
    return f"reverted:{run_id}"


# -- the autotune handshake (meta keys) --------------------------------------------------------
def autotune_key(run_id: int) -> str:
    return f"{AUTOTUNE}:{run_id}"


def epoch_done_key(run_id: int, rank: int) -> str:
    return f"epoch_done:{run_id}:{rank}"


def probe_stopped_key(run_id: int, rank: int) -> str:
    """Meta key the attach probe sets when recording stopped and its event could not be
    written either (the run's summary then says why, not 'no DataLoader')."""
    return f"probe_stopped:{run_id}:{rank}"


def ack_key(run_id: int, rank: int) -> str:
    return f"autotune_ack:{run_id}:{rank}"


def acked(value: str | None, epoch: int) -> bool:
    """Whether an ack value says the epoch is judged (a number >= epoch) or the search is
    over (SETTLED, or any other word)."""
    if value is None:
        return False
    return not value.lstrip("-").isdigit() or int(value) >= epoch


def epoch_done_value(epoch: int, at: float) -> str:
    """What a probe writes at an epoch start: the epoch it finished, and when (wall
    seconds): the tuner's stretch ends there, the loop's time between epochs (Lightning's
    validation, a plain loop's evaluation) included."""
    return f"{epoch}@{at:.6f}"


def epoch_done(value: str | None) -> tuple[int | None, float | None]:
    """An epoch-done mark read back: (the epoch finished, when its loop asked for the next
    one); (None, None) when there is none, a None time when it did not say."""
    head, _, at = (value or "").partition("@")
    epoch = int(head) if head.lstrip("-").isdigit() else None
    try:
        return epoch, float(at) if at else None
    except ValueError:
        return epoch, None
