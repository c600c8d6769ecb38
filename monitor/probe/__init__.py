"""What runs inside the user's training process: torch and the standard library only (ruff's
rule in this folder and tests/test_boundaries.py hold it). It finds the loaders a script
iterates (those of the frameworks real scripts use), times each step and its phases, counts
its samples, sees the DataLoader's workers, records a run's epochs, applies loader requests
at the next iter(), watches for stalls, and hands its steps to `monitor run` (the ring) or
the store. Nothing it does may raise into the training loop."""
