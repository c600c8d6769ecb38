"""Settings of a managed workload, validated eagerly with messages that say what to do.

This module imports neither torch nor streamlit: the dashboard process validates settings
before anything is spawned, and the workload process builds its DataLoader from the same
record.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from monitor.presets import PRESET_SPECS

PRESETS: tuple[str, ...] = tuple(PRESET_SPECS)
CUSTOM = "custom"  # the preset name of a user's own workload
USER_STEP_TIME_MS = 50.0  # simulated device step for a user dataset without model_step
DEFAULT_PRESET = "starving"
MAX_BATCH_SIZE = 4096
MAX_PREFETCH_FACTOR = 64
MAX_STEP_TIME_MS = 10_000.0
MODEL_SIZES: tuple[str, ...] = ("auto", "small", "medium", "large")
DEFAULT_PREFETCH = 2  # torch's own default batches per worker
MAX_WORKERS_CEILING = 1024  # a sanity bound; the machine's limit is passed to build()


@dataclass(frozen=True, slots=True)
class Setting:
    """One DataLoader setting this tool measures, advises and moves, declared once: its type,
    range, default, whether it applies only with worker processes (and its value without
    them), whether a built loader changes it at its next iter() (`live`), and the words
    shown beside it. Validation, `normalise`, the DataLoader's keyword arguments, the probe's
    reader, the CLI's flags and `--param` parsing, the page's widgets, the Job tab, the
    Prometheus labels and the Grafana annotation are derived from SETTINGS (a test walks
    each of them: tests/test_settings.py)."""

    name: str
    kind: type  # int or bool
    default: Any
    low: int = 0
    high: int = 0
    unit: str = ""  # what a whole number counts ("samples")
    note: str = ""  # said after an out-of-range value
    worker_only: bool = False  # applies only with num_workers >= 1
    off: Any = None  # its value with num_workers=0 (worker-only settings)
    live: bool = False  # a built DataLoader changes it at its next iter()
    passed_at_default: bool = True  # False: given to DataLoader only when changed (newer torch)
    help: str = ""
    choices: tuple[int, ...] = ()  # the values a page offers on its slider, where not a range
    short: str = ""  # a table's column head (the name where empty)

    def __post_init__(self) -> None:
        if not self.short:
            object.__setattr__(self, "short", self.name)

    @staticmethod
    def shown(value: Any) -> str:
        """A value in a table: on/off, '-' where unset."""
        return "-" if value is None else ("on" if value else "off") if isinstance(value, bool) \
            else str(value)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """A value as written on a command line ('4', 'on', 'false'); ValueError saying what
        this setting takes."""
        v = text.strip().lower()
        if self.kind is bool:
            if v not in ("0", "1", "on", "off", "true", "false"):
                raise ValueError(f"{self.name}: use on/off (or true/false), not {text!r}")
            return v in ("1", "on", "true")
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"{self.name}: {text!r} is not a whole number") from None

    def check(self, value: Any, num_workers: int) -> None:
        """ConfigError, saying what to do, for a value this setting does not take."""
        if value is None and self.worker_only:
            return  # unset: torch's default
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{self.name} must be true or false ({self.help})")
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{self.name} must be a whole number of {self.unit}"
                                  + (f" ({self.note})" if self.note else ""))
            if not self.low <= value <= self.high:
                raise ConfigError(f"{self.name}={value} is out of range: use {self.low} to "
                                  f"{self.high} {self.unit}"
                                  + (f" ({self.note})" if self.note else ""))
        if self.worker_only and num_workers == 0 and value != self.off:
            raise ConfigError(f"{self.name}={value!r} needs worker processes: set "
                              f"num_workers >= 1, or leave {self.name} at its default")


# in the order they are shown
SETTINGS: tuple[Setting, ...] = (
    Setting("num_workers", int, 0, 0, MAX_WORKERS_CEILING, "worker processes",
            note="num_workers=0 loads in the main process", live=True,
            help="worker processes; 0 loads in the training process"),
    Setting("batch_size", int, 32, 1, MAX_BATCH_SIZE, "samples", help="samples a batch",
            short="batch",
            choices=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)),
    Setting("prefetch_factor", int, DEFAULT_PREFETCH, 1, MAX_PREFETCH_FACTOR,
            "batches per worker", worker_only=True, off=None, live=True,
            help="batches each worker loads ahead (needs num_workers >= 1; default 2)",
            short="prefetch"),
    Setting("pin_memory", bool, False, live=True, short="pin",
            help="page-locked host memory for faster host-to-GPU copies"),
    Setting("persistent_workers", bool, False, worker_only=True, off=False, live=True,
            short="pers",
            help="keep workers between epochs (needs num_workers >= 1)"),
    Setting("in_order", bool, True, worker_only=True, off=True, live=True,
            passed_at_default=False,  # torch before 2.6 has none: passed only when off
            short="order",
            help="off: batches are handed over as the workers finish them, so one slow "
                 "sample does not hold the ones queued behind it (needs num_workers >= 1)"),
)
SETTING = {s.name: s for s in SETTINGS}
LOADER_SETTINGS = tuple(SETTING)
LIVE_SETTINGS = tuple(s.name for s in SETTINGS if s.live)
# A run's settings as the page's sidebar and `monitor compare` show them.
SHOWN_SETTINGS = ("preset", "workload", *LOADER_SETTINGS, "step_time_ms", "model_size")
WORKER_CEILING_X = 3  # the worker ceiling: this many loaders per usable core
ATTACHED_PREFIX = "attached:"  # the workload name of a user's own script


def attached_config(script: str, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """An attached run's recorded config: its loader's settings (none yet when `monitor run`
    creates the run) under the script's workload name. The one builder (the launcher, the
    probe's recorder and its loader report use it)."""
    return {"preset": CUSTOM, **(settings or {}), "workload": f"{ATTACHED_PREFIX}{script}"}


class ConfigError(ValueError):
    """An invalid setting; the message says which one and what to do."""


def max_workers(usable_cores: int) -> int:
    """Upper bound of the num_workers slider and the searches: three times the usable cores
    (storage-latency-bound loaders keep gaining past the core count: on the 2-core machine
    the io-bound preset's best is 6 workers; CPU-bound ones stop at the cores by themselves,
    since the diagnosis then calls them cores-bound)."""
    return WORKER_CEILING_X * max(1, int(usable_cores))


def prefetch_of(settings: Any) -> int:
    """The prefetch_factor a loader runs with (a mapping or a LoaderConfig): torch's default
    where it is unset."""
    pf = settings.get("prefetch_factor") if isinstance(settings, dict) \
        else getattr(settings, "prefetch_factor", None)
    return int(pf or DEFAULT_PREFETCH)


def in_flight(settings: Any) -> int:
    """The batches a loader keeps in flight: workers x prefetch_factor (none at 0 workers)."""
    nw = settings.get("num_workers") if isinstance(settings, dict) \
        else getattr(settings, "num_workers", 0)
    return int(nw or 0) * prefetch_of(settings)


def normalise(settings: dict[str, Any], clear: bool = True) -> dict[str, Any]:
    """The one rule for worker-only settings: with num_workers=0, prefetch_factor is None and
    persistent_workers off (torch refuses them); with workers, prefetch_factor defaults to
    DEFAULT_PREFETCH. `clear=False` only fills the default and leaves settings that do not
    apply in place, for a validator to refuse (the CLI's flags). Returns a new dict."""
    out = dict(settings)
    nw = out.get("num_workers", 0)
    if isinstance(nw, int) and not isinstance(nw, bool) and nw == 0:
        if not clear:
            return out
        out.update({s.name: s.off for s in SETTINGS if s.worker_only})
    elif out.get("prefetch_factor") is None:
        out["prefetch_factor"] = DEFAULT_PREFETCH
    return out


@dataclass(frozen=True, slots=True)
class LoaderConfig:
    """DataLoader settings plus the accelerator's knob, as the sliders and the CLI set them.

    prefetch_factor is None when num_workers == 0, as torch requires; with workers it defaults
    to torch's own default of 2.
    """

    preset: str = DEFAULT_PRESET
    num_workers: int = 0
    batch_size: int = 32
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    # False: workers' batches are handed over as they finish (torch 2.6+), so one slow sample
    # no longer holds the batches queued behind it
    in_order: bool = True
    step_time_ms: float | None = None  # device step; None: the preset's (or calibrated) one
    model_size: str = "auto"  # CUDA model: "auto" repeats a pass to take ~step_time_ms
    epoch_samples: int | None = None  # samples per epoch; None: the preset's
    workload: str | None = None  # a user's dataset, "path.py:callable" (preset "custom")

    def __post_init__(self) -> None:
        self._check_workload()
        self._check_loader()
        self._check_device()

    def _check_workload(self) -> None:
        if self.workload is not None:
            if self.preset != CUSTOM:
                raise ConfigError(f"a user workload runs as preset {CUSTOM!r}, not "
                                  f"{self.preset!r}: use LoaderConfig.build(workload=...)")
            if ":" not in self.workload:
                raise ConfigError(f"workload {self.workload!r} is not PATH.py:CALLABLE or "
                                  "package.module:CALLABLE")
        elif self.preset not in PRESETS:
            raise ConfigError(
                f"unknown preset {self.preset!r}: choose one of {', '.join(PRESETS)}"
            )

    def _check_loader(self) -> None:
        nw = self.num_workers
        for setting in SETTINGS:
            setting.check(getattr(self, setting.name), nw if isinstance(nw, int) else 0)

    def _check_device(self) -> None:
        if self.step_time_ms is not None:
            try:
                step = float(self.step_time_ms)
            except (TypeError, ValueError):
                raise ConfigError("step_time_ms must be a number of milliseconds") from None
            if not 0.0 <= step <= MAX_STEP_TIME_MS:
                raise ConfigError(
                    f"step_time_ms={self.step_time_ms} is out of range: use 0 to "
                    f"{MAX_STEP_TIME_MS:g} ms"
                )
        if self.epoch_samples is not None and (
                isinstance(self.epoch_samples, bool) or not isinstance(self.epoch_samples, int)
                or self.epoch_samples < self.batch_size):
            raise ConfigError(
                f"epoch_samples={self.epoch_samples!r} must be a whole number of samples, at "
                f"least one batch ({self.batch_size}); leave it unset for the preset's epoch"
            )
        if self.model_size not in MODEL_SIZES:
            raise ConfigError(
                f"unknown model_size {self.model_size!r}: choose one of {', '.join(MODEL_SIZES)}"
            )

    @classmethod
    def build(cls, worker_limit: int | None = None, **kwargs: Any) -> LoaderConfig:
        """Like the constructor, but normalised (`normalise`), with the preset's default step
        time made explicit, and num_workers checked against `worker_limit` (the machine's
        `max_workers`, passed in so that validation stays pure)."""
        if kwargs.get("workload"):
            kwargs["preset"] = CUSTOM
        spec = PRESET_SPECS.get(kwargs.get("preset", DEFAULT_PRESET))
        if kwargs.get("step_time_ms") is None and spec is not None and spec.step_ratio is None:
            kwargs["step_time_ms"] = spec.step_time_ms  # calibrated presets keep None: auto
        cfg = cls(**normalise(kwargs))
        if worker_limit is not None:
            cfg.check_workers(worker_limit)
        return cfg

    def check_workers(self, limit: int) -> None:
        """Refuse more workers than `limit` (three times the usable cores), saying so."""
        if self.num_workers > max(limit, 1):
            raise ConfigError(
                f"num_workers={self.num_workers} is more than {limit}, {WORKER_CEILING_X} per "
                f"usable core ({max(1, limit // WORKER_CEILING_X)} here): use at most {limit} "
                "(beyond that workers only compete for the cores)"
            )

    @classmethod
    def live_request(cls, current: dict[str, Any], worker_limit: int | None = None,
                     **changes: Any) -> dict[str, Any]:
        """An attached script's loader change, validated and normalised like any setting:
        returns the LIVE_SETTINGS to request. `current` is the run's recorded config;
        `worker_limit` the page's worker ceiling (the probe, which applies it, passes none)."""
        merged = {k: current.get(k) for k in LIVE_SETTINGS if current.get(k) is not None}
        merged.update({k: v for k, v in changes.items() if k in LIVE_SETTINGS})
        cfg = cls.build(worker_limit, workload=f"{ATTACHED_PREFIX}request",
                        batch_size=int(current.get("batch_size") or 1), **merged)
        return {k: getattr(cfg, k) for k in LIVE_SETTINGS}

    def replace(self, **changes: Any) -> LoaderConfig:
        """A copy with changes, normalised like `build`."""
        return LoaderConfig.build(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}: known are {sorted(known)}")
        return cls(**data)

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for torch.utils.data.DataLoader."""
        kw: dict[str, Any] = {}
        for s in SETTINGS:
            value = prefetch_of(self) if s.name == "prefetch_factor" else getattr(self, s.name)
            if (s.worker_only and self.num_workers == 0
                    or not s.passed_at_default and value == s.default):
                continue
            kw[s.name] = value
        return kw


def settings_label(settings: LoaderConfig | dict[str, Any]) -> str:
    """The one settings labeller: 'num_workers=2, batch_size=32, prefetch_factor=2', plus each
    switch away from its default ('pin_memory', 'in_order=False'); worker-only settings only
    with workers, and a setting a dict lacks (an attached run's live ones) left out."""
    d = settings.to_dict() if isinstance(settings, LoaderConfig) else settings
    workers = bool(d.get("num_workers"))
    parts = []
    for s in SETTINGS:
        v = d.get(s.name)
        if s.name not in d or s.worker_only and not workers:
            continue
        if s.kind is not bool:
            parts.append(f"{s.name}={v}")
        elif v is not None and bool(v) != s.default:
            parts.append(s.name if v else f"{s.name}=False")
    return ", ".join(parts)


def describe_change(old: LoaderConfig | dict[str, Any] | None,
                    new: LoaderConfig | dict[str, Any]) -> str:
    """The one change labeller: 'num_workers 0→2, batch_size 32→64' (empty when equal).
    Takes configs or dicts (an attached run records a dict of its loader's settings)."""
    if old is None:
        return "start"
    a = old.to_dict() if isinstance(old, LoaderConfig) else dict(old)
    b = new.to_dict() if isinstance(new, LoaderConfig) else dict(new)
    order = [f.name for f in dataclasses.fields(LoaderConfig)]
    parts = []
    for name in order + sorted((set(a) | set(b)) - set(order)):
        x, y = a.get(name), b.get(name)
        if name == "prefetch_factor" and (x is None or y is None):
            continue  # follows num_workers 0 <-> n; the num_workers part says it
        if x != y:
            parts.append(f"{name} {_fmt(x)}→{_fmt(y)}")
    return ", ".join(parts)


def _fmt(v: Any) -> str:
    if v is None:
        return "default"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
