"""An OTLP/HTTP trace receiver: what a collector gets from the daemon's exporter."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OtlpReceiver:
    """Spans posted to an OTLP/HTTP endpoint, decoded from ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.url = ""

    def spans(self) -> list[tuple[Any, Any]]:
        """(resource, span) for every span received so far."""
        out: list[tuple[Any, Any]] = []
        with self.lock:
            for req in self.requests:
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        out.extend((rs.resource, span) for span in ss.spans)
        return out


@contextlib.contextmanager
def otlp_http_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP trace receiver (protobuf payloads) on a free port, while in the block."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            with receiver.lock:
                receiver.requests.append(request)
                receiver.paths.append(self.path)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    yield receiver
    server.shutdown()
    server.server_close()
    thread.join()
