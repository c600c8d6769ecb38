"""What runs inside the user's training process: torch and the standard library only (ruff's
rule in this folder and tests/test_probe_fence.py hold it). patch.py finds the loaders,
loaders.py reads the ones real scripts use (their base DataLoader, settings, why one cannot
be re-tuned), recorder.py records a run's epochs and applies loader requests, timing.py is
the one timed iterator, epoch_plan.py the resumable epoch order, identity.py the rank,
watchdog.py the stall watchdog, _inject/ the sitecustomize that `monitor run` puts first on
the path."""
