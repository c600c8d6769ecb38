"""Each loader setting is declared once (config.SETTINGS); this walks every consumer and
fails where one misses a declared setting: validation, the DataLoader's arguments, the
probe's reader and its live change, the CLI's flags, `--param` and sweep table, the
search's labels, the Job tab, Prometheus's labels, the Grafana annotation, and the page's
widgets (the managed sidebar and an attached run's controls: tests/test_app.py)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.utils.data import DataLoader

from monitor.cli.args import build_parser, parse_param
from monitor.cli.main import _config, _print_results
from monitor.config import (
    LIVE_SETTINGS,
    LOADER_SETTINGS,
    SETTINGS,
    ConfigError,
    LoaderConfig,
    describe_change,
)
from monitor.export import promql, promread
from monitor.export.prometheus import METRICS
from monitor.probe.loaders import change_loader, fastai_settings, loader_settings, nodes_settings
from monitor.tuning.search import cost_key, describe, grid

ROOT = Path(__file__).resolve().parent.parent


def moved(s) -> object:
    """A value of the setting other than its default (with workers)."""
    if s.kind is bool:
        return not s.default
    return s.default + 1 if s.default + 1 <= s.high else s.default - 1


def with_workers(**extra) -> dict:
    return {"num_workers": 2, **extra}


def test_the_declaration_matches_the_config_record():
    fields = LoaderConfig.__dataclass_fields__
    for s in SETTINGS:
        assert s.name in fields, s.name
        assert fields[s.name].default == (s.off if s.worker_only else s.default), s.name
        assert s.help and s.short and s.flag == "--" + s.name.replace("_", "-")
    assert set(LIVE_SETTINGS) <= set(LOADER_SETTINGS)


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_validation_refuses_each_setting_saying_which(s):
    bad = "yes" if s.kind is bool else s.low - 1
    with pytest.raises(ConfigError, match=s.name):
        LoaderConfig(**{**with_workers(), s.name: bad})
    if s.worker_only:  # moved away from its value without workers: refused at 0 workers
        with pytest.raises(ConfigError, match=f"{s.name}.*needs worker processes"):
            LoaderConfig(**{s.name: moved(s)})
        assert getattr(LoaderConfig.build(**{"num_workers": 0, s.name: moved(s)}),
                       s.name) == s.off  # build() normalises it away
    ok = LoaderConfig.build(**with_workers(**{s.name: moved(s)}))
    assert getattr(ok, s.name) == moved(s)
    assert ok.loader_kwargs()[s.name] == moved(s)  # passed to torch
    assert s.name in describe_change(LoaderConfig.build(**with_workers()), ok)


def test_the_probe_reads_and_changes_every_setting():
    ds = list(range(64))
    wanted = {s.name: moved(s) for s in SETTINGS}
    wanted["num_workers"] = 2
    loader = DataLoader(ds, **{k: v for k, v in wanted.items()})
    got = loader_settings(loader)
    assert {k: got[k] for k in LOADER_SETTINGS} == wanted
    bare = loader_settings(DataLoader(ds))  # 0 workers: worker-only ones at their off
    assert {s.name: bare[s.name] for s in SETTINGS if s.worker_only} == {
        s.name: s.off for s in SETTINGS if s.worker_only}
    for other in (fastai_settings(SimpleNamespace(bs=4, fake_l=loader)),
                  nodes_settings(SimpleNamespace(root=None))):
        assert set(LOADER_SETTINGS) <= set(other), sorted(set(LOADER_SETTINGS) - set(other))
    # each live setting changed on a built loader, before its next iter()
    start = DataLoader(ds, batch_size=4, num_workers=1, persistent_workers=True)
    for s in SETTINGS:
        if not s.live:
            continue
        before = loader_settings(start)[s.name]
        value = 3 if s.name == "num_workers" else moved(s) if s.kind is int else not before
        refused, _, after, _ = change_loader(start, {s.name: value})
        assert refused is None and after[s.name] == value, (s.name, refused, after)
    assert sum(len(b) for b in start) == len(ds)  # it still runs, with every change


def test_the_cli_has_a_flag_and_a_sweep_parameter_for_each_setting(capsys):
    parser = build_parser(6)
    for s in SETTINGS:
        value = moved(s)
        flag = [s.flag if value else "--no-" + s.flag[2:]] if s.kind is bool else \
            [s.flag, str(value)]
        args = parser.parse_args(["measure", "--num-workers", "2", *flag])
        assert getattr(_config(args, 6), s.name) == value, s.name
        for cmd in ("sweep", "tune"):
            assert getattr(parser.parse_args([cmd, *flag]), s.name) == value
        text = ",".join(["on", "off"] if s.kind is bool else [str(s.default), str(value)])
        name, values = parse_param(f"{s.name}={text}")
        assert name == s.name and set(values) == ({True, False} if s.kind is bool
                                                  else {s.default, value})
    # the sweep's grid, labels and table carry each setting
    base = LoaderConfig.build(**with_workers())
    cells = grid(base, {s.name: [getattr(base, s.name), moved(s)] for s in SETTINGS
                        if s.name != "num_workers"})
    assert len(cells) == 2 ** (len(SETTINGS) - 1)
    assert len({describe(c) for c in cells}) == len(cells)  # each told apart by its label
    assert len({cost_key(c) for c in cells}) == len(cells)
    _print_results([SimpleNamespace(config=base, throughput=None, status="ok", reason=None)])
    head = capsys.readouterr().out.splitlines()[0].split()
    assert [s.short for s in SETTINGS] == head[:len(SETTINGS)]


def test_the_job_views_and_exports_list_every_setting():
    from monitor.ui.job_panel import SHOWN

    assert set(LOADER_SETTINGS) <= set(promread.COLUMNS) and set(LOADER_SETTINGS) <= set(SHOWN)
    info = next(m for m in METRICS if m[0] == "loader_info")
    assert set(LOADER_SETTINGS) <= {x.strip() for x in info[2].split(",")}
    shown = promql.dashboard()["annotations"]["list"][0]["textFormat"]
    deployed = json.loads((ROOT / "deploy" / "grafana" / "starvation-monitor.json").read_text())
    for s in SETTINGS:
        assert f"{s.name}={{{{{s.name}}}}}" in shown, s.name
    assert deployed["annotations"]["list"][0]["textFormat"] == shown


def test_a_sweep_over_in_order_is_taken():
    assert parse_param("in_order=true,false") == ("in_order", [True, False])
    with pytest.raises(ValueError, match="--param in_order: use on/off"):
        parse_param("in_order=sometimes")
    with pytest.raises(ValueError, match="--param batch_size: 'x' is not a whole number"):
        parse_param("batch_size=x")
