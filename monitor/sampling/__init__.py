"""The sampler process: host (psutil, /proc) and GPU (gpu/, NVML) readings written to the
store on a drift-free schedule."""
