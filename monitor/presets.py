"""The presets' numbers, kept free of torch so the dashboard and the workload both read them
(monitor/ may not import workloads/; workloads/synthetic.py builds the datasets from these)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PresetSpec:
    """What a preset's samples cost and what its accelerator step takes by default."""

    description: str
    shape: tuple[int, int, int]  # C, H, W of a decoded sample
    rounds: int  # augmentation passes per sample: the CPU cost knob
    io_latency_s: float  # modelled storage latency per sample
    step_time_ms: float  # default simulated accelerator step
    batch_size: int
    length: int  # samples per epoch
    # Each DataLoader worker "opens its shard index" once when it starts (modelled storage
    # latency, in worker_init_fn): what persistent_workers saves at every epoch start.
    worker_init_s: float = 0.3
    # When set, the default step is this ratio of the loading time per batch, measured by the
    # workload at start: the preset then starves the same way on a fast or a slow CPU.
    step_ratio: float | None = None


PRESET_SPECS: dict[str, PresetSpec] = {
    "starving": PresetSpec(
        "CPU work per batch 1.25x the accelerator step (the step is calibrated to 0.8x "
        "the loading time measured at start): one loader process cannot keep up, two can",
        (3, 64, 64), 8, 0.0, 60.0, 32, 4096, step_ratio=0.8),
    "io-bound": PresetSpec(
        "4 ms of storage latency per sample and little CPU: workers beyond the core count "
        "keep helping", (3, 64, 64), 1, 0.004, 30.0, 32, 4096),
    "cpu-bound": PresetSpec(
        "transforms costlier than the cores can feed: throughput plateaus once the cores are "
        "busy", (3, 64, 64), 24, 0.0, 20.0, 32, 4096),
    "healthy": PresetSpec(
        "cheap samples, long compute: the device is fed even with num_workers=0",
        (3, 32, 32), 0, 0.0, 100.0, 32, 8192),
    "memory-heavy": PresetSpec(
        "large 3x512x512 float32 samples (3 MiB each): prefetch depth and pin_memory move "
        "memory", (3, 512, 512), 0, 0.0, 50.0, 16, 1024),
}


def calibrated_step_ms(preset: str, sample_cost_s: float | None, batch_size: int
                       ) -> float | None:
    """A calibrated preset's simulated step: step_ratio x the loading time of a batch, from
    the per-sample cost the workload measured (None: not a calibrated preset, or no
    measurement yet)."""
    spec = PRESET_SPECS.get(preset)
    if spec is None or spec.step_ratio is None or sample_cost_s is None:
        return None
    return spec.step_ratio * sample_cost_s * batch_size * 1000.0


def preset_batch_size(preset: str) -> int:
    return PRESET_SPECS[preset].batch_size
