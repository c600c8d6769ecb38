"""Stand-ins for what this machine lacks, and only that (the house rule: real parts where a
user has them): NVML's GPUs (nvml.py), the nodes of a multi-node job as Prometheus would
scrape them (nodes.py), torch's CUDA for the probe's reads (cuda.py)."""
