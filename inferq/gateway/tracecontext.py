"""W3C Trace Context at the gateway: ``traceparent``/``tracestate`` in, ``X-Trace-Id`` out.

An ASGI middleware inside the front door (after a caller is admitted, before the fast path and
the routes). A call that carries a valid ``traceparent`` has it carried by every request it
queues (the routes pass ``trace_fields()`` to their enqueue calls: explicit, so the coalescer,
which sends many calls' requests together, keeps each one's); its answer has ``X-Trace-Id``.
With tracing on in the gateway (``inferq.tracing``), each call is a ``SERVER`` span (child of
the caller's context, or the root of a new trace) and the requests carry that span instead;
the answer names its trace. Off and without the header, it costs one scan of the headers.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq import tracing
from inferq.gateway.frontdoor import route_path

#: The context the current call's requests carry (None: none).
INCOMING: ContextVar[tracing.Parent | None] = ContextVar("inferq_trace_incoming", default=None)
HEADER = b"x-trace-id"
#: Probes answered without a span of their own (every few seconds, they would bury the calls).
UNTRACED = frozenset({"/healthz", "/readyz", "/metrics/usage"})


def trace_fields() -> tracing.TraceFields:
    """``enqueue`` keyword arguments that make the current call's requests carry its trace."""
    parent = INCOMING.get()
    return {} if parent is None else parent.fields()


def incoming() -> tracing.Parent | None:
    return INCOMING.get()


def span_name(method: str, path: str) -> str:
    """``POST /v1/requests``: the method and at most two path segments (no ids: the names of
    spans must stay few)."""
    return f"{method} {'/'.join(path.split('/')[:3]) or '/'}"


class TraceContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        traceparent = tracestate = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparent = value.decode("latin-1")
            elif name == b"tracestate":
                tracestate = value.decode("latin-1")
        tracer = tracing.tracer()
        parent = tracing.Parent.parse(traceparent, tracestate)
        if tracer is not None and route_path(scope) not in UNTRACED:
            await self._traced(tracer, parent, scope, receive, send)
        elif parent is not None:
            await self._carried(parent, scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _carried(self, parent: tracing.Parent, scope: Scope, receive: Receive,
                       send: Send, span: Any = None) -> None:
        token = INCOMING.set(parent)
        trace_id = parent.trace_id.encode()

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, trace_id)]
                if span is not None:
                    span.set_attribute("http.response.status_code", message["status"])
                    if message["status"] >= 500:
                        span.set_status(tracing.error_status(str(message["status"])))
            await send(message)

        try:
            await self.app(scope, receive, answer)
        finally:
            INCOMING.reset(token)

    async def _traced(self, tracer: Any, parent: tracing.Parent | None, scope: Scope,
                      receive: Receive, send: Send) -> None:
        path = route_path(scope)
        with tracing.server_span(tracer, span_name(scope["method"], path), parent, {
                "http.request.method": scope["method"], "url.path": path}) as span:
            mine = tracing.w3c_of(span)
            if mine is None:  # not sampled, or a no-op provider: carry the caller's
                mine = parent
            if mine is None:
                await self.app(scope, receive, send)
            else:
                await self._carried(mine, scope, receive, send, span)
