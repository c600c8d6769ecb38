"""Sweep and tune: the pure search (grid, knee, memory skips, the hill climb), the policy that
moves a loader one judged step at a time, and the live tuner that drives it on a running
job through control requests. Running experiments against real workloads is manage/'s."""
