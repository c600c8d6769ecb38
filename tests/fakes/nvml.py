"""A scripted stand-in for the pynvml module: enough of NVML's surface for the backend, with
the failure modes a real fleet shows (no driver, NOT_SUPPORTED fields, an empty sample
buffer, a GPU lost mid-run, driver clocks off wall time)."""
from __future__ import annotations

import types
from dataclasses import dataclass, field

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_DRIVER_NOT_LOADED = 9


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    name: str = "Fake H200"
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    pci: tuple[int, int, int] = (0, 0x3B, 0)
    util: float = 80.0
    mem_util: float = 20.0
    buffer: list[tuple[int, float]] = field(default_factory=list)  # (µs, util) the driver holds
    unsupported: set[str] = field(default_factory=set)  # NVML function names
    lost: bool = False
    gpm: bool = False
    sm_active: float = 55.0
    sm_occupancy: float = 30.0
    processes: list[tuple[int, int, float, float]] = field(default_factory=list)


class GpmMetric:
    def __init__(self):
        self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0


class GpmMetricsGet:
    def __init__(self):
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [GpmMetric() for _ in range(4)]


def make(gpus: list[FakeGpu], init_error: int | None = None) -> types.SimpleNamespace:
    calls: dict[str, int] = {}

    def api(name):
        def deco(fn):
            def wrapper(*args):
                calls[name] = calls.get(name, 0) + 1
                if args and isinstance(args[0], int) and args[0] < len(gpus):
                    g = gpus[args[0]]
                    if g.lost:
                        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
                    if name in g.unsupported:
                        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
                return fn(*args)
            wrapper.__name__ = name
            return wrapper
        return deco

    def init():
        if init_error is not None:
            raise NVMLError(init_error)

    @api("nvmlDeviceGetHandleByIndex")
    def handle(i):
        if gpus[i].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return i

    @api("nvmlDeviceGetSamples")
    def get_samples(h, kind, last_seen):
        fresh = [(t, v) for t, v in gpus[h].buffer if t > last_seen]
        if not fresh:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return 1, [types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(
            uiVal=int(v))) for t, v in fresh]

    @api("nvmlDeviceGetProcessUtilization")
    def proc_util(h, last_seen):
        rows = [types.SimpleNamespace(pid=p, timeStamp=t, smUtil=sm, memUtil=mu)
                for p, t, sm, mu in gpus[h].processes if t > last_seen]
        if not rows:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return rows

    def metrics_get(mg):
        g = gpus[mg.sample2["h"]]
        vals = {2: g.sm_active, 3: g.sm_occupancy}
        for m in mg.metrics[: mg.numMetrics]:
            m.value = vals[m.metricId]
        return mg

    def sample_get(h, s):
        if gpus[h].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        s["h"] = h
        return s

    ns = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_ERROR_GPU_IS_LOST=NVML_ERROR_GPU_IS_LOST,
        NVML_ERROR_NOT_SUPPORTED=NVML_ERROR_NOT_SUPPORTED, NVML_GPU_UTILIZATION_SAMPLES=1,
        NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1, NVML_GPM_METRICS_GET_VERSION=1,
        NVML_GPM_METRIC_SM_UTIL=2, NVML_GPM_METRIC_SM_OCCUPANCY=3,
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus), nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=api("nvmlDeviceGetName")(lambda h: gpus[h].name.encode()),
        nvmlDeviceGetUUID=api("nvmlDeviceGetUUID")(lambda h: gpus[h].uuid),
        nvmlDeviceGetPciInfo=api("nvmlDeviceGetPciInfo")(lambda h: types.SimpleNamespace(
            domain=gpus[h].pci[0], bus=gpus[h].pci[1], device=gpus[h].pci[2])),
        nvmlDeviceGetMemoryInfo=api("nvmlDeviceGetMemoryInfo")(
            lambda h: types.SimpleNamespace(used=2 << 30, total=141 << 30)),
        nvmlDeviceGetUtilizationRates=api("nvmlDeviceGetUtilizationRates")(
            lambda h: types.SimpleNamespace(gpu=gpus[h].util, memory=gpus[h].mem_util)),
        nvmlDeviceGetClockInfo=api("nvmlDeviceGetClockInfo")(lambda h, k: 1980),
        nvmlDeviceGetPowerUsage=api("nvmlDeviceGetPowerUsage")(lambda h: 350_000),
        nvmlDeviceGetTemperature=api("nvmlDeviceGetTemperature")(lambda h, k: 41),
        nvmlDeviceGetPcieThroughput=api("nvmlDeviceGetPcieThroughput")(
            lambda h, k: 2048 if k == 1 else 1024),
        nvmlDeviceGetSamples=get_samples, nvmlDeviceGetProcessUtilization=proc_util,
        nvmlGpmQueryDeviceSupport=api("nvmlGpmQueryDeviceSupport")(
            lambda h: types.SimpleNamespace(isSupportedDevice=int(gpus[h].gpm))),
        nvmlGpmSampleAlloc=lambda: {}, nvmlGpmSampleFree=lambda s: None,
        nvmlGpmSampleGet=sample_get, nvmlGpmMetricsGet=metrics_get,
        c_nvmlGpmMetricsGet_t=GpmMetricsGet, calls=calls,
    )
    return ns
