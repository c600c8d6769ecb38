"""Nodes' exporters for the Job tab's tests: each serves /metrics as `monitor run
--metrics-port` does (the same series names and labels), its ranks' counters growing with
the time since it started, so a real Prometheus scraping them sees a job of any size. A node
that has not `joined` answers 503, as a node whose job has not started yet is down to
Prometheus."""
from __future__ import annotations

import http.server
import threading
import time
from dataclasses import dataclass, field

STEPS_PER_S = 10.0
SAMPLES_PER_STEP = 32
STEP_S = 0.1


@dataclass
class FakeRank:
    rank: int
    wait_s: float  # data wait per step
    verdict: str = "healthy"
    num_workers: int = 2


@dataclass
class FakeNode:
    job_id: str
    node_rank: int
    hostname: str
    ranks: list[FakeRank]
    joined: bool = True
    started: float = field(default_factory=time.time)

    def text(self) -> str:
        t = max(0.0, time.time() - self.started)
        out = []
        for r in self.ranks:
            lab = (f'job_id="{self.job_id}",node_rank="{self.node_rank}",rank="{r.rank}",'
                   f'hostname="{self.hostname}",local_rank="{r.rank % 8}",run_id="1",'
                   'gpu="",UUID=""')
            steps = STEPS_PER_S * t
            for name, v in (("steps_total", steps), ("samples_total", steps * SAMPLES_PER_STEP),
                            ("data_wait_seconds_total", steps * r.wait_s),
                            ("step_seconds_total", steps * STEP_S)):
                out.append(f"starvation_{name}{{{lab}}} {v:.6f}")
            # as prometheus_client writes a counter's start (the real exporter: the rank's
            # first step)
            out.append(f"starvation_samples_created{{{lab}}} {self.started:.3f}")
            out.append(f'starvation_run_info{{{lab},name="train.py",kind="attached",'
                       f'status="running",accelerator_kind="cpu",world_size="3"}} 1')
            out.append(f'starvation_verdict{{{lab},starvation_verdict="{r.verdict}"}} 1')
            out.append(f'starvation_loader_info{{{lab},num_workers="{r.num_workers}",'
                       'prefetch_factor="2",pin_memory="False",persistent_workers="False",'
                       'batch_size="32"} 1')
        return "\n".join(out) + "\n"

    def serve(self) -> tuple[http.server.ThreadingHTTPServer, int]:
        node = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if not node.joined:
                    self.send_response(503)
                    self.end_headers()
                    return
                if not getattr(node, "_counting", False):
                    node.started, node._counting = time.time(), True  # its job starts now
                body = node.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv, srv.server_address[1]
