"""The `tracing` phase (runner.PHASES): the cost of OTLP export."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from .config import CFG, BenchError, log
from .load import provider_run, summary_brief

if TYPE_CHECKING:
    from .runner import Bench


class OtlpSink:
    def __init__(self) -> None:
        sink = self
        self.requests = 0
        self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("content-length") or 0)
                if n:
                    self.rfile.read(n)
                sink.requests += 1
                sink.bytes += n
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run(bench: Bench) -> None:
    if not bench.ingest:
        raise BenchError("the ingest is not running")
    for relay in bench.relays:
        if relay.p.poll() is None:
            relay.stop()
    secs = CFG["trace_secs"]
    bench.product.reset(CFG["product_history"])
    plain = summary_brief(provider_run(bench.ingest.url, "untraced", bench.ingest, concurrency=64, secs=secs))
    bench.ingest.stop()
    bench.ingest = None
    sink = OtlpSink()
    try:
        traced_ingest = bench.services.start_ingest("traced", {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url})
        try:
            bench.product.reset(CFG["product_history"])
            traced = summary_brief(provider_run(traced_ingest.url, "traced", traced_ingest, concurrency=64,
                                                secs=secs))
            time.sleep(1)
            bench.rss["ingest_traced"] = traced_ingest.rss()
        finally:
            traced_ingest.stop()
        exported = {"requests": sink.requests, "bytes": sink.bytes}
    finally:
        sink.close()
    overhead = round((1 - traced["requests_per_s"] / plain["requests_per_s"]) * 100, 1)
    bench.details["tracing"] = {"untraced": plain, "traced": traced, "otlp_sink": exported}
    bench.report["tracing_overhead_pct"] = overhead
    bench.report["ingest_rps_c64_traced"] = traced["requests_per_s"]
    log(f"  tracing: {plain['requests_per_s']:,.0f} -> {traced['requests_per_s']:,.0f} req/s "
        f"({overhead}% overhead), p99 {plain['p99_ms']} -> {traced['p99_ms']} ms, sink got "
        f"{exported['requests']} exports ({exported['bytes'] / 1e6:.1f} MB)")
    if exported["requests"] == 0:
        bench.errors["tracing"] = "the OTLP sink received nothing: was anything exported?"
