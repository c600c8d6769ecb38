"""The loaders' TCP peers and their reads not from storage (NOTE [remote reads] in
monitor/sampling/sockets.py), from a /proc fixture and from a real connection."""
from __future__ import annotations

import json
import os
import socket

from monitor.sampling.sockets import NetReads, _addr, tcp_peers


def test_addresses_read_as_the_kernel_writes_them():
    assert _addr("0100007F:1F90") == "127.0.0.1:8080"
    assert _addr("0000000000000000FFFF00000100007F:0050") == "127.0.0.1:80"
    assert _addr("B80D01200000000000000000D2040000:01BB").endswith(":443")


def test_only_established_connections_of_the_process_are_peers(tmp_path):
    pid = 7
    (tmp_path / "7" / "net").mkdir(parents=True)
    head = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
            "  timeout inode\n")
    rows = ["   0: 0100007F:9C40 0A00000A:01BB 01 00000000:00000000 00:00000000 00000000 0 0 111 1",
            "   1: 0100007F:9C41 0A00000A:01BB 06 00000000:00000000 00:00000000 00000000 0 0 112 1",
            "   2: 0100007F:9C42 0B00000A:0050 01 00000000:00000000 00:00000000 00000000 0 0 999 1"]
    (tmp_path / "7" / "net" / "tcp").write_text(head + "\n".join(rows) + "\n")
    assert tcp_peers(pid, {"111", "112"}, str(tmp_path)) == {"10.0.0.10:443": 1}


def test_only_the_loaders_own_connections_count():
    """The main process loading (no workers): a connection it holds at every pass (a
    process group's, a tracker's) is not a read; one new since the last pass is. A forked
    worker's inherited sockets are its parent's (the fixture's worker is this process, so
    everything it holds is its parent's)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(2)
    kept = socket.create_connection(srv.getsockname())
    conns = [srv.accept()[0]]
    net = NetReads()
    peer = f"127.0.0.1:{srv.getsockname()[1]}"
    try:
        assert net.sample(None, os.getpid(), [])["loaders_peers"] is None  # first pass
        assert net.sample(None, os.getpid(), [])["loaders_peers"] is None  # held since
        fresh = socket.create_connection(srv.getsockname())
        conns.append(srv.accept()[0])
        got = json.loads(net.sample(None, os.getpid(), [])["loaders_peers"])
        assert peer in got and len(got) == 2, got  # the new pair's two ends: both ours here
        assert net.sample(None, os.getpid(), [os.getpid()])["loaders_peers"] is None
        fresh.close()
    finally:
        for s in (kept, *conns, srv):
            s.close()


def test_the_tcp_tables_are_read_again_when_the_loaders_sockets_change(tmp_path):
    """A worker holding the same sockets pass after pass (a DataLoader's Unix sockets): the
    namespace's TCP tables are read once and then one pass in PEERS_EVERY, and at once when
    a socket of the loaders' comes or goes."""
    from monitor.sampling.sockets import PEERS_EVERY

    head = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
            "  timeout inode\n")

    def table(peer_hex: str) -> None:
        (tmp_path / "7" / "net" / "tcp").write_text(
            head + f"   0: 0100007F:9C40 {peer_hex} 01 00000000:00000000 00:00000000 00000000"
            " 0 0 111 1\n")

    for pid in (7, 8):
        (tmp_path / str(pid) / "fd").mkdir(parents=True)
    (tmp_path / "7" / "net").mkdir()
    os.symlink("socket:[111]", tmp_path / "8" / "fd" / "3")  # the worker's (8) own socket
    table("0A00000A:01BB")
    net = NetReads(proc=str(tmp_path))

    def peers() -> dict:
        return json.loads(net.sample(0, 7, [8])["loaders_peers"] or "{}")

    assert peers() == {"10.0.0.10:443": 1}
    table("0B00000A:01BB")  # the table changes, the worker's sockets do not: not read again
    assert all(peers() == {"10.0.0.10:443": 1} for _ in range(PEERS_EVERY - 1))
    assert peers() == {"10.0.0.11:443": 1}  # ... until PEERS_EVERY passes
    table("0C00000A:01BB")
    os.symlink("socket:[112]", tmp_path / "8" / "fd" / "4")  # a socket comes: read at once
    assert peers() == {"10.0.0.12:443": 1}


def test_unix_sockets_are_not_the_loaders_connections_and_read_no_table(monkeypatch):
    """A DataLoader's Unix sockets (its queues; one connection a batch where descriptors are
    passed) come and go: they are no connection the loaders read over, and the namespace's
    TCP tables are not read for them (a new TCP connection is: the test above)."""
    from monitor.sampling import sockets

    asked: list[set[str]] = []
    real = sockets.tcp_peers
    monkeypatch.setattr(sockets, "tcp_peers",
                        lambda pid, inodes, proc="/proc": asked.append(set(inodes)) or
                        real(pid, inodes, proc))
    net = NetReads()
    net.sample(None, os.getpid(), [])
    pair = socket.socketpair()  # new since the last pass, as a request's connection would be
    try:
        out = net.sample(None, os.getpid(), [])
    finally:
        for s in pair:
            s.close()
    assert out["loaders_peers"] is None
    assert not any(asked), asked  # (the old code asked for the pair's two inodes)
