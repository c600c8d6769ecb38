"""The sampler: host (psutil, /proc) and GPU (NVML) readings of a run's processes and of
the processes beside them, written to the store on a drift-free schedule."""
