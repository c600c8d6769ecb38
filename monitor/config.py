"""Settings of a managed workload, validated eagerly with messages that say what to do.

This module imports neither torch nor streamlit: the dashboard process validates settings
before anything is spawned, and the workload process builds its DataLoader from the same
record.
"""
from __future__ import annotations

import dataclasses
import json
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
# The DataLoader settings this tool measures, advises and moves (the sliders, the sweep's
# parameters, a user workload's defaults), in the order they are shown.
LOADER_SETTINGS = ("num_workers", "batch_size", "prefetch_factor", "pin_memory",
                   "persistent_workers", "in_order")
# Those a built DataLoader can change at its next iter() (an attached script's loader, the
# live autotuner's moves).
LIVE_SETTINGS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "in_order")
# A run's settings as the page's sidebar and `monitor compare` show them.
SHOWN_SETTINGS = ("preset", "workload", *LOADER_SETTINGS, "step_time_ms", "model_size")
WORKER_CEILING_X = 3  # the worker ceiling: this many loaders per usable core
ATTACHED_PREFIX = "attached:"  # the workload name of a user's own script


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
        out["prefetch_factor"] = None
        out["persistent_workers"] = False
        out["in_order"] = True  # batches of the main process come in order
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
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int):
            raise ConfigError("num_workers must be a whole number (0 loads in the main process)")
        if self.num_workers < 0:
            raise ConfigError(
                f"num_workers={self.num_workers} is negative: use num_workers=0 to load in the "
                "main process, or a positive count of worker processes"
            )
        if self.num_workers > MAX_WORKERS_CEILING:
            raise ConfigError(f"num_workers={self.num_workers} is more than this tool allows "
                              f"({MAX_WORKERS_CEILING})")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            raise ConfigError("batch_size must be a whole number of samples, at least 1")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ConfigError(
                f"batch_size={self.batch_size} is out of range: use 1 to {MAX_BATCH_SIZE}"
            )
        if self.prefetch_factor is not None:
            if self.num_workers == 0:
                raise ConfigError(
                    "prefetch_factor only applies with worker processes: leave it unset "
                    "with num_workers=0, or set num_workers >= 1"
                )
            if isinstance(self.prefetch_factor, bool) or not isinstance(self.prefetch_factor, int):
                raise ConfigError("prefetch_factor must be a whole number of batches per worker")
            if not 1 <= self.prefetch_factor <= MAX_PREFETCH_FACTOR:
                raise ConfigError(
                    f"prefetch_factor={self.prefetch_factor} is out of range: use 1 to "
                    f"{MAX_PREFETCH_FACTOR} batches per worker"
                )
        if not isinstance(self.in_order, bool):
            raise ConfigError("in_order must be true or false (false: batches as they finish)")
        if not self.in_order and self.num_workers == 0:
            raise ConfigError("in_order=False needs worker processes: set num_workers >= 1, "
                              "or leave in_order on")
        if self.persistent_workers and self.num_workers == 0:
            raise ConfigError(
                "persistent_workers needs worker processes: set num_workers >= 1, or turn "
                "persistent_workers off"
            )

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

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}: known are {sorted(known)}")
        return cls(**data)

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for torch.utils.data.DataLoader."""
        kw: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
        }
        if self.num_workers > 0:
            kw["prefetch_factor"] = prefetch_of(self)
            kw["persistent_workers"] = self.persistent_workers
            if not self.in_order:  # (torch before 2.6 has no in_order: only passed when off)
                kw["in_order"] = False
        return kw


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
