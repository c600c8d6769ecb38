"""The /metrics endpoint served: the snapshot of the families that a loop keeps up to date
while scrapes come (Snapshots), and a WSGI app that answers a scrape with the snapshot's
bytes after the few families read at the scrape itself (the counters), in the format and
encoding the scraper asked for, as prometheus-client's own app renders them (its
`choose_encoder` picks the format: the text format, or OpenMetrics, which Prometheus asks
for; an OpenMetrics text ends with one "# EOF", and gzip members concatenate into one
stream). NOTE [scrape from a snapshot] in monitor/export/prometheus.py says why.

The loop builds a snapshot for each scrape, just before it is due: scrapers come at a
fixed interval (Prometheus's scrape_interval), so the next is expected one interval (the
median of the last ones) after the last, and the build starts LEAD_S plus one and a half
builds' time before it: a snapshot's gauges and verdicts are then a fraction of a second
old at a scrape, at the least cost (a 15 s interval: one build in 15 s). A scrape that
arrives while a build runs waits for it. Scraped faster than once in REFRESH_S (or before
an interval is known), it builds every REFRESH_S. With no scrape for IDLE_S it builds
nothing; a scrape that finds no snapshot, or one older than STALE_S intervals (the loop
behind), builds one itself. A format is rendered once per snapshot, by the builder for each
format asked for before, so a scrape renders only the counters."""
from __future__ import annotations

import gzip
import math
import socket
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from monitor.periodic import Periodic

Format = tuple[str, bool]  # (the Accept header, gzip accepted)
Response = tuple[list[tuple[str, str]], bytes]  # headers, body
REFRESH_S = 1.0  # builds at most this often
LEAD_S = 0.1  # a build ends this long before the scrape it is for (and 1.5 builds' time)
TICK_S = 0.05  # the loop's check of whether a build is due
IDLE_S = 120.0  # no scrape for this long: the loop builds nothing
STALE_S = 3.0  # scrape intervals: a snapshot older than this is built at the scrape
MAX_FORMATS = 4  # formats rendered with each snapshot (Prometheus asks for one)
EOF = b"# EOF\n"  # the end of an OpenMetrics text


class Families(Collector):
    """A registry of fixed families, as the encoders read one."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Iterable[Any]:
        return self.families


def render(families: list[Any], fmt: Format) -> Response:
    """The response headers and body of `families` in the format `fmt` asks for."""
    encoder, content_type = choose_encoder(fmt[0])
    body = encoder(Families(families))
    headers = [("Content-Type", content_type)]
    if fmt[1]:
        body = gzip.compress(body, compresslevel=6)
        headers.append(("Content-Encoding", "gzip"))
    return headers, body


@dataclass(slots=True)
class Snapshot:
    """The families at one moment, what the scrape-time ones need (`plan`), and the
    families' exposition in each format rendered so far."""

    at: float  # monotonic
    plan: Any
    families: list[Any]
    rendered: dict[Format, Response]


class Snapshots:
    """The snapshot a scrape is answered from, and the loop that keeps it: `families()`
    gives (plan, families); `live(plan)` gives the families read at each scrape."""

    def __init__(self, families: Callable[[], tuple[Any, list[Any]]],
                 live: Callable[[Any], list[Any]]) -> None:
        self.families, self.live = families, live
        self.snapshot: Snapshot | None = None
        self.wanted: dict[Format, None] = {}  # the formats scrapers asked for, newest last
        self.last_scrape = -math.inf
        self.intervals: deque[float] = deque(maxlen=8)  # between the last scrapes
        self.build_s = 0.0  # how long the last build took (monotonic seconds)
        self.lock = threading.Lock()  # scrapes run on the HTTP server's threads
        self.build_lock = threading.Lock()
        self.loop = Periodic("starvation-exporter", self._keep, TICK_S)

    def answer(self, fmt: Format) -> Response:
        """A scrape: the families read now (the counters, first, as the scrape arrives:
        Prometheus stamps them with its start), then the current snapshot's (rendered once
        per snapshot; the next builds render them with the snapshot), in the format asked."""
        snap = self.current()
        _, live = render(self.live(snap.plan), (fmt[0], False))
        if self.build_lock.locked():  # a build for this scrape is under way: its families
            with self.build_lock:
                pass
            snap = self.snapshot or snap
        with self.lock:
            got = snap.rendered.get(fmt)
        if got is None:
            got = render(snap.families, fmt)
            with self.lock:
                snap.rendered[fmt] = got
                self.wanted.pop(fmt, None)
                self.wanted[fmt] = None
                while len(self.wanted) > MAX_FORMATS:
                    self.wanted.pop(next(iter(self.wanted)))
        headers, rest = got
        if live.endswith(EOF):  # (OpenMetrics: one # EOF, the snapshot's)
            live = live[:-len(EOF)]
        if fmt[1]:
            live = gzip.compress(live, compresslevel=6)
        return headers, live + rest

    def current(self) -> Snapshot:
        """The snapshot a scrape is answered from: the loop's, else one built now (no
        wait for a build under way: the counters are read first)."""
        now = time.monotonic()
        with self.lock:
            if now - self.last_scrape < IDLE_S:
                self.intervals.append(now - self.last_scrape)
            self.last_scrape = now
        snap = self.snapshot
        if not self.loop.alive or snap is None or \
                now - snap.at > STALE_S * max(REFRESH_S, self.interval() or 0.0):
            snap = self.build()
        return snap

    def build(self) -> Snapshot:
        """Every family now, rendered in each format asked for before (one build at a
        time)."""
        with self.build_lock:
            t0 = time.monotonic()
            plan, families = self.families()
            with self.lock:
                wanted = list(self.wanted)
            snap = Snapshot(time.monotonic(), plan, families,
                            {fmt: render(families, fmt) for fmt in wanted})
            self.snapshot, self.build_s = snap, snap.at - t0
            return snap

    def interval(self) -> float | None:
        """The scrape interval: the median of the last ones (None before two scrapes)."""
        with self.lock:
            return statistics.median(self.intervals) if self.intervals else None

    def due(self, now: float) -> bool:
        """Whether the loop builds now: the next scrape is expected within LEAD_S and 1.5
        builds and the snapshot is an earlier scrape's (or, scraped faster than REFRESH_S,
        the snapshot is REFRESH_S old)."""
        snap, interval = self.snapshot, self.interval()
        if snap is None:
            return True
        if interval is None or interval < REFRESH_S:
            return now - snap.at >= REFRESH_S
        late = max(0.0, now - self.last_scrape)
        nxt = self.last_scrape + interval * max(1, math.ceil(late / interval))
        return snap.at < nxt - interval / 2 and now >= nxt - LEAD_S - 1.5 * self.build_s

    def keep_fresh(self) -> Snapshots:
        """Start the loop (until stop())."""
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop()

    def _keep(self) -> None:
        now = time.monotonic()
        if now - self.last_scrape < IDLE_S and self.due(now):
            try:
                self.build()
            except Exception:  # a store that cannot be read now: the snapshot ages, and the
                pass  # next scrape builds one itself, or answers 503 with why


class Exporter:
    """/metrics being served: the HTTP server, the snapshots' loop, the collector."""

    def __init__(self, server: Any, snapshots: Snapshots, collector: Any) -> None:
        self.server, self.snapshots, self.collector = server, snapshots, collector

    def shutdown(self) -> None:
        self.snapshots.stop()
        self.server.shutdown()

    def server_close(self) -> None:
        self.server.server_close()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """(No line per scrape.)"""


def start(port: int, address: str, answer: Callable[[Format], Response]) -> Any:
    """Serve `answer(format)` for GET on every path, in daemon threads; returns the server
    (shutdown(), server_close()). OSError when the address cannot be bound."""

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
            return [b"Method Not Allowed"]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [])
            return [b""]
        try:
            headers, body = answer((environ.get("HTTP_ACCEPT") or "",
                                    gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or "")))
        except Exception as exc:  # a store that cannot be read now: this scrape fails, said
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"starvation-monitor: the store cannot be read now ({type(exc).__name__}:"
                    f" {exc}); the next scrape tries again\n".encode()]
        start_response("200 OK", list(headers))  # (a copy: wsgiref adds Content-Length to it)
        return [body]

    class Server(ThreadingWSGIServer):
        """(This address's family: IPv6 where the address is one.)"""

    info = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    Server.address_family, host = info[0][0], info[0][4][0]
    httpd = make_server(host, port, app, Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="starvation-metrics-http",
                     daemon=True).start()
    return httpd
