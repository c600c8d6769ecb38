"""The monitor's own processes on the host (this sampler's, the dashboard servers, other
`monitor` commands) and their CPU: a line of its own in a host row, left out of the
verdict's "other processes" and never the watched job's."""
from __future__ import annotations

import os
import time

from monitor.sampling import procfs

OWN_EVERY = 80  # passes between looks for the monitor's own processes (a process scan)


def is_monitor(cmdline: list[str]) -> bool:
    """A command line of this monitor's: `starvation-monitor ...`, `python -m monitor ...`,
    or a Streamlit server of its app.py."""
    args = [str(a) for a in cmdline]
    if any(os.path.basename(a) == "starvation-monitor" for a in args[:2]):
        return True
    if args[1:3] == ["-m", "monitor"]:
        return True
    return any("streamlit" in a for a in args[:3]) and any(
        os.path.basename(a) == "app.py" for a in args)


class OwnProcesses:
    """Found by their command lines one pass in OWN_EVERY, each command line read once a
    process (by PID and start: psutil's scan read every process's at each look, ~12 ms for
    70 processes here); their CPU from their stat each pass."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.pids: set[int] = set()
        self._cmds: dict[tuple[int, int], bool] = {}  # (PID, start) -> one of ours
        self._cpu: dict[tuple[int, int], float] = {}  # their CPU seconds, last pass
        self._t: float | None = None

    def _look(self, workload: set[int | None]) -> None:
        known, self._cmds, me = self._cmds, {}, os.getpid()
        for pid in procfs.pids(self.proc):
            if pid in workload or (st := procfs.proc_stat(pid, self.proc)) is None:
                continue
            mine = known.get((pid, st.start))
            if mine is None:
                cmd = procfs.read_text(f"{self.proc}/{pid}/cmdline") or ""
                mine = pid == me or is_monitor(cmd.rstrip("\0").split("\0"))
            self._cmds[pid, st.start] = mine
        self.pids = {me} | {pid for (pid, _), mine in self._cmds.items() if mine}

    def cpu_pct(self, passes: int, workload: set[int | None]) -> float | None:
        """Their CPU since the last pass, in % of one core (None on the first)."""
        if passes % OWN_EVERY == 0:
            self._look(workload)
        now, total, cur = time.monotonic(), 0.0, {}
        for pid in self.pids:
            if (st := procfs.proc_stat(pid, self.proc)) is None:
                continue
            cur[pid, st.start] = c = st.cpu_s
            total += max(0.0, c - self._cpu.get((pid, st.start), c))
        before, self._cpu, self._t = self._t, cur, now
        return 100.0 * total / (now - before) if before is not None and now > before else None
