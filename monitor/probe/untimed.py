"""An untimed loader's waits, watched for a stall (standard library only, inside the training
process): a validation loader, a later loader of a plain loop, an evaluation pass over the
training loader. Their steps are not the training's, but a worker that hangs in one stops
the training as surely as in the training loader (NOTE [an untimed loader's stall] below).
"""
from __future__ import annotations

from typing import Any

from monitor.probe.workers import unbound


# NOTE [an untimed loader's stall]
# A plain script whose validation loader's worker never returned a sample (2 workers each
# loader; tests/scripts/hangs_early.py WORKERS validation is the suite's) stopped training
# for the 35 s it ran on; under `monitor run` the run read `stopped` at the user's Ctrl-C,
# no stall named, its verdict the training epoch's. The probe passes such a loader's iterator
# through as it came and wraps only its `_next_data` (torch's DataLoader iterators; an
# attribute of the iterator, no cycle through it, as monitor/probe/workers.py does for the
# timed one): while the loop waits there, `probe.untimed` holds since when, whether for the
# pass's first batch, and which loader. The watchdog (monitor/probe/watchdog.py) judges that
# wait as it judges the timed loader's (stall_limit_s; a pass's first batch gets the start-up
# allowance: its workers start at iter()), and its `stalled` event, stderr line and the run's
# reason name the loader; so does its own error on its way to the loop (a worker killed), a
# `loader-error` event as the timed loader's is. A clock read and two attribute writes a
# batch; nothing of the batch is touched. A pass begun on probation (NOTE [the model's
# mode] in monitor/probe/choice.py) is watched the same way; found to train, its timed waits
# are the ones the watchdog reads.
def named(loader: str, text: str) -> str:
    """What the watchdog or the recorder says of an untimed loader: `text`, as that loader's."""
    return f"{loader}, not timed (validation?): {text}"


def watch_waits(it: Any, probe: Any, loader: str) -> bool:
    """Watch the waits of `it` (an iterator of an untimed torch DataLoader) for a stall;
    False where it has no `_next_data` (another library's iterator) or is watched already."""
    ask = getattr(it, "_next_data", None)
    if not callable(ask) or getattr(ask, "_starvation_watch", False):
        return False
    call = unbound(it, "_next_data")
    del ask
    first = [True]
    pids = [getattr(w, "pid", None) for w in getattr(it, "_workers", None) or ()]

    def _next_data(*args: Any, **kwargs: Any) -> Any:
        probe.untimed = (probe.clock(), first[0], loader)
        try:
            return call(*args, **kwargs)
        except (StopIteration, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the loader's own, passed on as it came
            told = probe.on_untimed_error
            if told is not None and probe.waiting_since is None:  # (timed: a pass found to
                # train, whose TimedIterator tells its loader's error itself)
                try:
                    told(exc, loader, pids)
                except Exception:
                    pass
            raise
        finally:
            probe.untimed = None
            first[0] = False

    _next_data._starvation_watch = True  # type: ignore[attr-defined]
    it._next_data = _next_data
    return True
