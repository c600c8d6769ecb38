"""What the loaders read over the network (NOTE [remote reads])."""

# NOTE [remote reads]
# A loader that fetches its samples over the network (S3, GCS, HTTP, a WebDataset shard in a
# bucket, HF streaming) sits in socket reads: neither on a CPU nor reading the block device,
# so the time split calls it blocked, like a sleep or a lock. What tells it apart, read from
# outside the unmodified script each pass: the loaders' TCP connections and their peers
# (their descriptors' socket inodes, looked up in /proc/<pid>/net/tcp and tcp6: the
# process's own network namespace), and the bytes they read through read() that the block
# device did not serve (/proc/<pid>/io rchar - read_bytes: sockets, and page-cache hits,
# which the peers tell apart). diagnosis/causes.py names it with the peer, the bytes a
# sample and the wait a sample; more loaders than cores overlap it (the bound model's l).
# Only the loaders' own connections count: a forked worker inherits its parent's sockets
# (torch.distributed's gloo pairs and store, a tracker's), so a worker's are those its parent
# does not hold; the main process loading itself (num_workers=0) holds the job's own
# connections for its whole life, so its are those new since the last look (a request a
# connection; a kept-alive client's pool is not seen there). Two torchrun ranks that sleep
# for their samples read "remote-reads" on their gloo connections before this. The sampler
# looks one pass in NET_EVERY (monitor/sampling/host.py; ~1 ms a look for 5 processes) and
# repeats the last look between: a share of passes that saw a peer reads the same.
from __future__ import annotations

import json
import os
import time

from monitor.sampling.procfs import io_counts

ESTABLISHED = "01"
MAX_FDS = 4096  # descriptors looked at a process, at most (a loader holds tens)
PEERS_EVERY = 8  # passes: the TCP tables read at least this often (NetReads._peers)


def _inodes(pid: int, proc: str) -> set[str]:
    """The inodes of the process's TCP sockets (IPv4 and IPv6). A socket's protocol is its
    `system.sockprotoname` attribute (sockfs; 2 µs a socket): a DataLoader's Unix sockets
    (its queues, and one connection a batch where file descriptors are passed) are left
    out, so they never make the TCP tables be read. A socket whose protocol cannot be read
    counts as TCP."""
    out: set[str] = set()
    try:
        names = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return out
    for name in names[:MAX_FDS]:
        path = f"{proc}/{pid}/fd/{name}"
        try:
            link = os.readlink(path)
        except OSError:
            continue
        if link.startswith("socket:[") and _tcp(path):
            out.add(link[8:-1])
    return out


def _tcp(path: str) -> bool:
    try:
        return os.getxattr(path, "system.sockprotoname").startswith(b"TCP")
    except (OSError, AttributeError):  # (no such attribute here; no getxattr off Linux)
        return True


def _addr(hex_addr: str) -> str:
    """'0100007F:1F90' -> '127.0.0.1:8080' (IPv4; IPv6 as its mapped IPv4 where it is one)."""
    ip, port = hex_addr.split(":")
    if len(ip) == 8:
        host = ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0))
    elif ip.startswith("0000000000000000FFFF0000"):
        v4 = ip[24:]
        host = ".".join(str(int(v4[i:i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        words = [ip[i:i + 8] for i in range(0, 32, 8)]
        host = "[" + ":".join("".join(w[j:j + 2] for j in (6, 4, 2, 0)).lower()
                              for w in words) + "]"
    return f"{host}:{int(port, 16)}"


def tcp_peers(pid: int, inodes: set[str], proc: str = "/proc") -> dict[str, int]:
    """The remote ends of the process's established TCP connections among `inodes`."""
    peers: dict[str, int] = {}
    if not inodes:
        return peers
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    p = line.split()
                    if len(p) > 9 and p[3] == ESTABLISHED and p[9] in inodes:
                        peers[_addr(p[2])] = peers.get(_addr(p[2]), 0) + 1
        except (OSError, ValueError):
            continue
    return peers


class NetReads:
    """Per key (a rank, or the followed process): the loaders' bytes read not from the block
    device since the last pass (KB/s), and the peers of their TCP connections now (JSON
    {peer: connections}); the loaders are the workers, or the main process without them."""

    def __init__(self, proc: str = "/proc", clock=time.monotonic) -> None:
        self.proc, self.clock = proc, clock
        self._prev: dict[int | None, tuple[float, dict[int, tuple[int, int]]]] = {}
        self._held: dict[int | None, set[str]] = {}  # the main process's sockets, last pass
        # the loaders' own socket inodes at the last read of the TCP tables, and the peers
        # read: the tables (every connection of the namespace: hundreds on a busy host) are
        # read again when the loaders' sockets changed, else one pass in PEERS_EVERY (a
        # connection still being made at the last read is established by then). Only TCP
        # sockets are the loaders' (_inodes): a job whose loaders hold none reads no table
        self._peers: dict[int | None, tuple[frozenset[str], dict[str, int], int]] = {}

    def sample(self, key: int | None, main: int, workers: list[int],
               counts: dict[int, tuple[int, int] | None] | None = None) -> dict:
        """`counts`: the processes' io counts this pass has read already (pid -> (rchar,
        read_bytes)), else they are read here."""
        pids = workers or [main]
        now = self.clock()
        io = {p: v for p in pids if (v := (counts[p] if counts is not None and p in counts
                                           else io_counts(p, self.proc))) is not None}
        parent = _inodes(main, self.proc)
        held, self._held[key] = self._held.get(key), parent
        own: set[str] = set()  # the loaders' own connections (NOTE above)
        for p in workers:
            own |= _inodes(p, self.proc) - parent
        if not workers and held is not None:
            own = parent - held
        # one read of the namespace's table when the loaders' sockets changed (a forked
        # worker shares its parent's namespace)
        mine, last = frozenset(own), self._peers.get(key)
        if last is not None and last[0] == mine and last[2] < PEERS_EVERY:
            peers = last[1]
            self._peers[key] = (mine, peers, last[2] + 1)
        else:
            peers = tcp_peers(main, own, self.proc)
            self._peers[key] = (mine, peers, 1)
        prev, self._prev[key] = self._prev.get(key), (now, io)
        out: dict = {"loaders_net_kb_s": None,
                     "loaders_peers": json.dumps(peers) if peers else None}
        if prev is not None and now > prev[0]:
            both = [p for p in io if p in prev[1]]
            if both:
                got = sum((io[p][0] - prev[1][p][0]) - (io[p][1] - prev[1][p][1])
                          for p in both)
                out["loaders_net_kb_s"] = max(0.0, got) / 1024 / (now - prev[0])
        return out
