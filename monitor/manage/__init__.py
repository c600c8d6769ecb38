"""The processes we start and own: runtime.py (the composition root, NOTE [shutdown
protocol]), session.py (managed workloads), measure.py (a managed run start to finish),
attached_run.py (a user's script under the probe), collector_process.py, workload_spec.py,
and spawn.py, the one way a child is started."""
