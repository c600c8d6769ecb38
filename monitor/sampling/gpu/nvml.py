"""NVML through nvidia-ml-py: the only module that imports pynvml.

Reads, per GPU and per sampling pass:
- utilization from the driver's sample buffer (`nvmlDeviceGetSamples`, every sample since
  the last one seen, at the driver's own time stamps: 1/6 s to 1 s apart by product), falling
  back to `nvmlDeviceGetUtilizationRates` when the buffer is empty or unsupported;
- memory-controller utilization, memory used/total, SM clock, power, temperature;
- PCIe rx/tx (at most once a second: each counter read blocks ~20 ms in the driver);
- the workload's own SM utilization (`nvmlDeviceGetProcessUtilization`), so a shared GPU does
  not mislead;
- on Hopper and newer, where `nvmlGpmQueryDeviceSupport` says so, GPM SM activity and SM
  occupancy from two GPM samples at least 100 ms apart: 100% "utilization" only means some
  kernel ran, not that the SMs were busy.

Every read goes through `_query`, which turns NVML errors (NOT_SUPPORTED, NO_PERMISSION...)
into a missing value, so one unsupported field never kills the loop (DESIGN.md style rule 2);
GPU_IS_LOST marks that device lost and the others go on. An import or init failure is recorded
in `notice` and never raised (rule 3). The module and the clock are injected (rule 4).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from monitor.records import GpuSample, GpuUtilSample
from monitor.sampling.gpu.base import GpuDevice, GpuPass

MB = 1024 * 1024
NO_DRIVER_HINT = "NVIDIA driver not found: showing the simulated accelerator's step-derived series"
PCIE_PERIOD_S = 1.0
GPM_MIN_GAP_S = 0.1  # GPM metrics need two samples more than 100 ms apart
MAX_CLOCK_SKEW_S = 5.0  # driver time stamps further than this from wall time get an offset
# c_nvmlValue_t members by nvmlValueType_t
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                 6: "usVal"}


def _load_pynvml() -> tuple[ModuleType | None, str]:
    try:
        import pynvml  # the one import of pynvml in the project
    except ImportError as exc:
        return None, f"nvidia-ml-py is not installed ({exc}): pip install nvidia-ml-py"
    return pynvml, ""


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


@dataclass
class _Dev:
    info: GpuDevice
    handle: Any
    last_util_us: int = 0
    last_proc_us: int = 0
    samples_ok: bool = True
    lost: bool = False
    clock_offset: float | None = None
    last_pcie: float = float("-inf")
    pcie: tuple[float | None, float | None] = (None, None)
    gpm_prev: Any = None
    gpm_next: Any = None
    gpm_prev_t: float = 0.0
    gpm: tuple[float | None, float | None] = (None, None)
    errors: dict[str, str] = field(default_factory=dict)


class NvmlBackend:
    """Samples every NVML device; see the module docstring for what and how."""

    def __init__(
        self, nvml: ModuleType | None = None, clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.monotonic = monotonic
        self.available = False
        self.notice = ""
        self._devs: list[_Dev] = []
        self._pids: set[int] = set()
        if nvml is None:
            nvml, err = _load_pynvml()
            if nvml is None:
                self.notice = err
                return
        self.nvml = nvml
        self._lost_code = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self._not_supported = {getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                               getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)}
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.notice = f"{NO_DRIVER_HINT} ({exc})"
            return
        count = self._call(None, nvml.nvmlDeviceGetCount) or 0
        for i in range(count):
            h = self._call(None, nvml.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                continue
            self._devs.append(self._open(i, h))
        if not self._devs:
            self.notice = ("NVIDIA driver loaded but no GPU visible: showing the simulated "
                           "accelerator")
            return
        self.available = True
        self.notice = "GPU telemetry from NVML: " + ", ".join(
            f"{d.info.index}: {d.info.name}" for d in self._devs)

    # -- setup -------------------------------------------------------------------------
    def _open(self, i: int, h: Any) -> _Dev:
        nv = self.nvml
        name = self._call(None, nv.nvmlDeviceGetName, h)
        uuid = self._call(None, nv.nvmlDeviceGetUUID, h)
        mem = self._call(None, nv.nvmlDeviceGetMemoryInfo, h)
        pci_info = self._call(None, nv.nvmlDeviceGetPciInfo, h)
        pci = None
        if pci_info is not None:
            pci = (int(pci_info.domain), int(pci_info.bus), int(pci_info.device))
        gpm = False
        if hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            sup = self._call(None, nv.nvmlGpmQueryDeviceSupport, h)
            gpm = bool(sup is not None and getattr(sup, "isSupportedDevice", 0))
        dev = _Dev(GpuDevice(i, _text(name) if name is not None else f"GPU {i}",
                             _text(uuid) if uuid is not None else None, pci,
                             mem.total / MB if mem is not None else None, gpm), h)
        if gpm:
            dev.gpm_prev = self._call(dev, nv.nvmlGpmSampleAlloc)
            dev.gpm_next = self._call(dev, nv.nvmlGpmSampleAlloc)
            if dev.gpm_prev is None or dev.gpm_next is None:
                dev.info = dataclasses.replace(dev.info, gpm=False)
        return dev

    def _call(self, dev: _Dev | None, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML read; an error is a missing value (and a lost GPU marks `dev` lost)."""
        try:
            return fn(*args)
        except Exception as exc:  # pynvml.NVMLError and subclasses
            if dev is not None:
                if getattr(exc, "value", None) == self._lost_code:
                    dev.lost = True
                dev.errors[getattr(fn, "__name__", "?")] = str(exc)
            return None

    # -- API ---------------------------------------------------------------------------
    def devices(self) -> list[GpuDevice]:
        return [d.info for d in self._devs]

    def follow_pids(self, pids: set[int]) -> None:
        """PIDs whose per-process SM utilization is recorded (the workload's)."""
        self._pids = set(pids)

    def sample(self) -> GpuPass:
        samples, util, lost = [], [], []
        for dev in self._devs:
            if dev.lost:
                continue
            s, u = self._sample_dev(dev)
            util.extend(u)
            samples.append(s)
            if dev.lost:
                lost.append(dev.info.index)
                samples[-1] = GpuSample(**{**_blank(s.ts, dev.info.index), "lost": 1})
                self.notice = (f"GPU {dev.info.index} ({dev.info.name}) was lost at "
                               f"{time.strftime('%H:%M:%S')}; the other GPUs go on")
        return GpuPass(tuple(samples), tuple(util), tuple(lost))

    def close(self) -> None:
        if self.available:
            for d in self._devs:
                for s in (d.gpm_prev, d.gpm_next):
                    if s is not None:
                        self._call(None, self.nvml.nvmlGpmSampleFree, s)
            self._call(None, self.nvml.nvmlShutdown)
            self.available = False

    # -- one device ----------------------------------------------------------------------
    def _wall(self, dev: _Dev, ts_us: int, now: float) -> float:
        """Driver time stamp (µs) -> wall seconds. The driver stamps with the host's clock;
        where that disagrees with ours by more than MAX_CLOCK_SKEW_S (a container's clock,
        a driver's monotonic base), an offset anchored at the newest sample is applied."""
        t = ts_us / 1e6
        if dev.clock_offset is None or abs(t + dev.clock_offset - now) > MAX_CLOCK_SKEW_S:
            dev.clock_offset = 0.0 if abs(t - now) <= MAX_CLOCK_SKEW_S else now - t
        return t + dev.clock_offset

    def _util_samples(self, dev: _Dev, now: float) -> list[GpuUtilSample]:
        nv = self.nvml
        if not dev.samples_ok:
            return []
        try:
            vtype, raw = nv.nvmlDeviceGetSamples(dev.handle, nv.NVML_GPU_UTILIZATION_SAMPLES,
                                                 dev.last_util_us)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if code == self._lost_code:
                dev.lost = True
            elif code in self._not_supported:
                dev.samples_ok = False
            return []  # NOT_FOUND: nothing new in the buffer (an idle GPU)
        fname = _VALUE_FIELDS.get(int(vtype), "uiVal")
        fresh = sorted((s for s in raw if s.timeStamp > dev.last_util_us),
                       key=lambda s: s.timeStamp)
        if not fresh:
            return []
        newest = fresh[-1].timeStamp
        self._wall(dev, newest, now)  # anchor the offset on the newest sample
        out = [GpuUtilSample(self._wall(dev, s.timeStamp, now), dev.info.index,
                             float(getattr(s.sampleValue, fname)), "samples") for s in fresh]
        dev.last_util_us = newest
        return out

    def _proc_util(self, dev: _Dev) -> tuple[float | None, float | None]:
        if not self._pids:
            return None, None
        rows = self._call(dev, self.nvml.nvmlDeviceGetProcessUtilization, dev.handle,
                          dev.last_proc_us)
        if not rows:
            return None, None
        dev.last_proc_us = max([dev.last_proc_us, *(r.timeStamp for r in rows)])
        mine = [r for r in rows if r.pid in self._pids]
        if not mine:
            return 0.0, 0.0  # samples exist, none from the workload: it is not on this GPU
        by_ts: dict[int, list[float]] = {}
        for r in mine:
            by_ts.setdefault(r.timeStamp, [0.0, 0.0])
            by_ts[r.timeStamp][0] += r.smUtil
            by_ts[r.timeStamp][1] += r.memUtil
        sm = sum(v[0] for v in by_ts.values()) / len(by_ts)
        mem = sum(v[1] for v in by_ts.values()) / len(by_ts)
        return sm, mem

    def _gpm(self, dev: _Dev) -> tuple[float | None, float | None]:
        nv = self.nvml
        t = self.monotonic()
        if not dev.info.gpm or t - dev.gpm_prev_t < GPM_MIN_GAP_S:
            return dev.gpm
        if self._call(dev, nv.nvmlGpmSampleGet, dev.handle, dev.gpm_next) is None:
            return None, None
        if dev.gpm_prev_t > 0:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 2
            mg.sample1, mg.sample2 = dev.gpm_prev, dev.gpm_next
            mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            mg.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
            if self._call(dev, nv.nvmlGpmMetricsGet, mg) is not None:
                vals = [float(m.value) if not getattr(m, "nvmlReturn", 0) else None
                        for m in (mg.metrics[0], mg.metrics[1])]
                dev.gpm = (vals[0], vals[1])
        dev.gpm_prev, dev.gpm_next = dev.gpm_next, dev.gpm_prev
        dev.gpm_prev_t = t
        return dev.gpm

    def _sample_dev(self, dev: _Dev) -> tuple[GpuSample, list[GpuUtilSample]]:
        nv, h, now = self.nvml, dev.handle, self.clock()
        util = self._util_samples(dev, now)
        rates = self._call(dev, nv.nvmlDeviceGetUtilizationRates, h)
        if not util and rates is not None:
            util = [GpuUtilSample(now, dev.info.index, float(rates.gpu), "rates")]
        mem = self._call(dev, nv.nvmlDeviceGetMemoryInfo, h)
        clock = self._call(dev, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        power = self._call(dev, nv.nvmlDeviceGetPowerUsage, h)
        temp = self._call(dev, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        mono = self.monotonic()
        if mono - dev.last_pcie >= PCIE_PERIOD_S:
            rx = self._call(dev, nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
            tx = self._call(dev, nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)
            dev.pcie = (rx / 1024.0 if rx is not None else None,
                        tx / 1024.0 if tx is not None else None)  # KB/s -> MB/s
            dev.last_pcie = mono
        sm_active, sm_occ = self._gpm(dev)
        proc_sm, proc_mem = self._proc_util(dev)
        return GpuSample(
            ts=now, gpu=dev.info.index,
            mem_util_pct=float(rates.memory) if rates is not None else None,
            mem_used_mb=mem.used / MB if mem is not None else None,
            mem_total_mb=mem.total / MB if mem is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            power_w=power / 1000.0 if power is not None else None,
            temp_c=float(temp) if temp is not None else None,
            pcie_rx_mbps=dev.pcie[0], pcie_tx_mbps=dev.pcie[1],
            sm_active_pct=sm_active, sm_occupancy_pct=sm_occ,
            proc_sm_pct=proc_sm, proc_mem_pct=proc_mem, lost=0,
        ), util


def _blank(ts: float, gpu: int) -> dict[str, Any]:
    return {"ts": ts, "gpu": gpu, "mem_util_pct": None, "mem_used_mb": None,
            "mem_total_mb": None, "sm_clock_mhz": None, "power_w": None, "temp_c": None,
            "pcie_rx_mbps": None, "pcie_tx_mbps": None, "sm_active_pct": None,
            "sm_occupancy_pct": None, "proc_sm_pct": None, "proc_mem_pct": None, "lost": 0}
