"""The processes we start and own, and their lifetimes: the composition root (runtime.py,
NOTE [shutdown protocol]), managed workloads and the runs they make, a user's script under
the probe with its relay and outputs, the sampler's process, and the one way a child is
started."""
