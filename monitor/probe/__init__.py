"""What runs inside the user's training process: torch and the standard library only (ruff's
rule in this folder and tests/test_boundaries.py hold it). patch.py finds the loaders,
loaders.py reads the ones real scripts use (their base DataLoader, settings, why one cannot
be re-tuned), recorder.py records a run's epochs and applies loader requests, timing.py is
the one timed iterator, epoch_plan.py the resumable epoch order, identity.py the rank,
watchdog.py the stall watchdog (and the writer of the attached probe's steps), workers.py what
it sees of the DataLoader workers, _inject/ the sitecustomize that `monitor run` puts first on
the path."""
