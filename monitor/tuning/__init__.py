"""Sweep and tune: search.py is the pure search (grid, knee, memory skips, the hill climb);
experiment.py runs it against real workloads; jobs.py runs experiments in the background for
the page."""
