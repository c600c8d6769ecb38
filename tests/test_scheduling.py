"""The suite's own scheduling: browser tests share one xdist worker (conftest.py), so two
Chromiums never starve each other on two cores. pytest 9.2 with pytest-xdist 3.8 dropped
the group silently (pytest-xdist#1386: the worker's nodeid suffix no longer takes), and the
suite ran its browser tests side by side for a round without anyone seeing it."""
from __future__ import annotations

import pytest


def test_browser_tests_are_grouped_on_one_worker(request):
    config = request.config
    if not getattr(config.option, "loadgroup", False):
        pytest.skip("not run under `--dist loadgroup` (make test runs it so)")
    browser = [i for i in request.session.items if i.get_closest_marker("browser")]
    assert browser, "no browser test collected"
    ungrouped = [i.nodeid for i in browser if not i.nodeid.endswith("@browser")]
    assert not ungrouped, f"browser tests left out of their xdist group: {ungrouped[:3]}"
