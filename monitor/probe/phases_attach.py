"""The attach probe's step phases (monitor/probe/phases.py): installed unless turned off
(`monitor run --no-phases`), and what they met said once through the recorder."""
from __future__ import annotations

import os
from collections.abc import Callable

from monitor.probe.phases import ENV, Phases


def wanted() -> bool:
    return os.environ.get(ENV, "1") != "0"


def attach(say: Callable[..., None]) -> Phases | None:
    """The attach probe's phases, installed (None when turned off or they cannot be);
    `say(text, loud=True)` records what they met, once."""
    if not wanted():
        return None
    ph = Phases(lambda why: say(f"step phases off: {why}; the steps are timed as before"))

    def roots(names: list[str]) -> None:
        inside = list(ph.loader_modules)
        said = (f"; {', '.join(inside)} ran inside next(loader): the loader's work "
                "(transforms), counted in the data wait, not the forward") if inside else ""
        say(f"step phases: the forward pass timed at {', '.join(names) or 'none'} (the "
            f"outermost modules the loop calls){said}", loud=False)
    ph.on_roots = roots
    return ph if ph.install() else None
