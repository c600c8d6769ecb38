"""The names of the variables `monitor run` sets for the probe in the script's interpreter
(beside the store's, monitor/store/core.py ENV_VAR, and the relay's, monitor/ring.py ENV).
Nothing imported: `monitor run` names them before it starts the script, and importing the
probe itself for them cost `monitor run`'s start ~50 ms with a core busy."""

RUN_ENV = "STARVATION_MONITOR_RUN_ID"
# the script `monitor run` started, by name: a rank in a process of a framework's own
# (Ray's default_worker.py) records its run under the script's name, not its process's
SCRIPT_ENV = "STARVATION_MONITOR_SCRIPT"
