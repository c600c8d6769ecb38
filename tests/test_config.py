"""LoaderConfig validation: each bad setting is refused with a message that says what to do."""
from __future__ import annotations

import pytest

from monitor.config import ConfigError, LoaderConfig, describe_change, max_workers


def test_defaults_are_the_starving_preset_without_workers():
    cfg = LoaderConfig()
    assert cfg.preset == "starving" and cfg.num_workers == 0 and cfg.prefetch_factor is None
    assert cfg.loader_kwargs() == {"batch_size": 32, "num_workers": 0, "pin_memory": False}


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"num_workers": -1}, "num_workers=0"),
        ({"batch_size": 0}, "use 1 to"),
        ({"num_workers": 0, "prefetch_factor": 2}, "set num_workers >= 1"),
        ({"num_workers": 2, "prefetch_factor": 0}, "use 1 to"),
        ({"num_workers": 0, "persistent_workers": True}, "set num_workers >= 1"),
        ({"preset": "nope"}, "choose one of"),
        ({"step_time_ms": -5}, "use 0 to"),
        ({"num_workers": 1.5}, "whole number"),
        ({"num_workers": True}, "whole number"),
        ({"model_size": "huge"}, "choose one of"),
    ],
)
def test_invalid_settings_are_refused_with_a_hint(kwargs, hint):
    with pytest.raises(ConfigError, match=hint):
        LoaderConfig(**kwargs)


def test_build_fills_and_clears_worker_only_settings():
    on = LoaderConfig.build(num_workers=2)
    assert on.prefetch_factor == 2
    off = on.replace(num_workers=0, persistent_workers=True)
    assert off.prefetch_factor is None and off.persistent_workers is False
    assert on.loader_kwargs()["prefetch_factor"] == 2


def test_round_trip_and_unknown_keys():
    cfg = LoaderConfig.build(num_workers=3, batch_size=64, pin_memory=True)
    assert LoaderConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown setting"):
        LoaderConfig.from_dict({**cfg.to_dict(), "workers": 2})


def test_change_labels_name_each_changed_field():
    a = LoaderConfig.build(num_workers=0)
    b = a.replace(num_workers=2, pin_memory=True)
    label = describe_change(a, b)
    assert "num_workers 0→2" in label and "pin_memory off→on" in label
    assert "prefetch_factor" not in label  # implied by num_workers 0→2
    assert describe_change(b, b.replace(prefetch_factor=4)) == "prefetch_factor 2→4"
    assert describe_change(None, a) == "start"


def test_worker_limit_is_passed_in_and_says_what_to_do():
    assert max_workers(3) == 9 and max_workers(0) == 3
    assert LoaderConfig.build(num_workers=4, worker_limit=4).num_workers == 4
    with pytest.raises(ConfigError, match="use at most 4"):
        LoaderConfig.build(num_workers=5, worker_limit=4)


def test_attached_requests_are_validated_and_normalised():
    current = {"num_workers": 0, "batch_size": 8, "prefetch_factor": None,
               "pin_memory": False, "persistent_workers": False}
    assert LoaderConfig.live_request(current, num_workers=2) == {
        "num_workers": 2, "prefetch_factor": 2, "pin_memory": False,
        "persistent_workers": False, "in_order": True}
    assert LoaderConfig.live_request({**current, "num_workers": 2}, in_order=False)[
        "in_order"] is False
    # batches of the main process come in order: in_order follows num_workers 0
    assert LoaderConfig.live_request({**current, "num_workers": 2, "in_order": False},
                                     num_workers=0)["in_order"] is True
    with pytest.raises(ConfigError, match="in_order=False needs worker processes"):
        LoaderConfig(num_workers=0, in_order=False)
    assert LoaderConfig.build(num_workers=2, in_order=False).loader_kwargs()["in_order"] \
        is False
    assert "in_order" not in LoaderConfig.build(num_workers=2).loader_kwargs()
    assert LoaderConfig.live_request({**current, "num_workers": 2}, num_workers=0,
                                     prefetch_factor=4, persistent_workers=True)[
        "prefetch_factor"] is None
    with pytest.raises(ConfigError, match="num_workers=0"):
        LoaderConfig.live_request(current, num_workers=-1)
    # the page's request is held to the sidebar's worker ceiling; the probe's, to none
    with pytest.raises(ConfigError, match="use at most 6"):
        LoaderConfig.live_request(current, 6, num_workers=7)
    assert LoaderConfig.live_request(current, num_workers=7)["num_workers"] == 7


def test_change_labels_work_on_recorded_dicts():
    a = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False}
    assert describe_change(a, {**a, "num_workers": 2, "prefetch_factor": 2}) == \
        "num_workers 0→2"
