"""The /metrics endpoint served: a WSGI app that answers each scrape with what the store
holds now (Scrapes): every family but the counters, then the counters, in the format and
encoding the scraper asked for, as prometheus-client's own app renders them (its
`choose_encoder` picks the format: the text format, or OpenMetrics, which Prometheus asks
for), the text written by monitor/export/exposition.py. NOTE [what a scrape reads] in
monitor/export/prometheus.py says what a scrape costs and why it reads at the scrape."""
from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted

from monitor.export.exposition import Renderer

Format = tuple[str, bool]  # (the Accept header, gzip accepted)
Response = tuple[list[tuple[str, str]], bytes]  # headers, body
# 67 KB of text at 8 ranks: level 1 compresses it in 0.17 ms to 2.9 KB, level 6 in 0.58 ms
# to 2.7 KB
GZIP_LEVEL = 1
RENDERER = Renderer()  # (the client's text, its label sets escaped once: exposition.py)


def render(families: list[Any], fmt: Format) -> Response:
    """The response headers and body of `families` in the format `fmt` asks for."""
    encoder, content_type = choose_encoder(fmt[0])
    body = RENDERER.render(families, encoder)
    headers = [("Content-Type", content_type)]
    if fmt[1]:
        body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        headers.append(("Content-Encoding", "gzip"))
    return headers, body


class Scrapes:
    """The answer to each scrape: `read()` gives every family, read from the store now (in a
    few ms: NOTE [what a scrape reads])."""

    def __init__(self, read: Callable[[], list[Any]]) -> None:
        self.read = read

    def answer(self, fmt: Format) -> Response:
        return render(self.read(), fmt)


class Exporter:
    """/metrics being served: the HTTP server, its answers, the collector."""

    def __init__(self, server: Any, scrapes: Scrapes, collector: Any) -> None:
        self.server, self.scrapes, self.collector = server, scrapes, collector

    def shutdown(self) -> None:
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
