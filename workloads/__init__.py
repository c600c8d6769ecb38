"""What runs inside the workload process: datasets, the accelerator step, the entry point."""
