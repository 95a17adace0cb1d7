"""A tiny OTLP/HTTP receiver (stdlib ``http.server``): it keeps every span posted to
``/v1/traces`` (protobuf, decoded with ``opentelemetry-proto``), with its service's name."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from inferq.embedded import free_port


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    links: tuple[tuple[str, str], ...]
    events: tuple[str, ...]
    attributes: dict[str, Any] = field(hash=False)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        service = next((_value(a.value) for a in resource_spans.resource.attributes
                        if a.key == "service.name"), "")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                out.append(Span(
                    service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                    tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                    tuple(e.name for e in s.events),
                    {a.key: _value(a.value) for a in s.attributes}))
    return out


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        self.changed = threading.Condition()

    def add(self, body: bytes) -> None:
        spans = decode(body)
        with self.changed:
            self.spans.extend(spans)
            self.posts += 1
            self.changed.notify_all()

    def wait_for(self, predicate: Callable[[list[Span]], bool], timeout: float,
                 what: str) -> list[Span]:
        """Block until ``predicate(spans)`` holds (woken by each post), or fail naming
        ``what``."""
        with self.changed:
            if not self.changed.wait_for(lambda: predicate(self.spans), timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; got "
                                     f"{[(s.service, s.name) for s in self.spans]}")
            return list(self.spans)


@contextmanager
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A receiver and its endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/traces":
                got.add(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
