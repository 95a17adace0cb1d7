"""OpenTelemetry traces across the queue (docs/guides/tracing.md). The one module that imports
``opentelemetry``, and only once tracing is on.

**On or off.** ``pip install 'inferq[otel]'``, then the standard variables:

* ``OTEL_TRACES_EXPORTER`` set (``otlp``: OTLP over HTTP/protobuf to
  ``OTEL_EXPORTER_OTLP_ENDPOINT``, default ``http://localhost:4318``; ``console``; several,
  comma-separated) turns it on: inferq sets up the SDK (sampler from ``OTEL_TRACES_SAMPLER``
  and ``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_SERVICE_NAME``, batching from ``OTEL_BSP_*``), unless
  the process already has an SDK tracer provider, which it then uses;
* ``OTEL_SDK_DISABLED=true``, or ``OTEL_TRACES_EXPORTER`` unset or ``none``: off. Except that
  an application that set a global tracer provider itself (``trace.set_tracer_provider``) gets
  its producer spans and its context carried through the queue, as an instrumented library
  should: inferq then uses that provider.

Off, nothing imports ``opentelemetry`` and each hook costs one call returning None
(``tracer()``); a caller's explicit ``traceparent=`` is still carried to the worker.

**What travels.** A request's payload carries a W3C ``traceparent`` (and ``tracestate``):
the producer's ``enqueue`` span, or the caller's context when inferq does not trace. Workers
continue that trace on every attempt (``inferq.worker.core.traces``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

from inferq.errors import ValidationError

log = logging.getLogger("inferq.tracing")

#: A W3C traceparent: version, trace id, parent (span) id, flags, lowercase hex.
TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: W3C Trace Context: a tracestate of at most 32 list members; 512 characters is the size that
#: every vendor must propagate. Printable ASCII only.
MAX_TRACESTATE = 512
TRACESTATE_RE = re.compile(r"^[\x20-\x7e]*$")
INSTRUMENTATION = "inferq"
#: Links of one ``enqueue_many`` span at most (the SDK's default limit).
MAX_LINKS = 128
#: Exporters inferq sets up from ``OTEL_TRACES_EXPORTER``.
EXPORTERS = ("otlp", "console")


def valid_ids(traceparent: str) -> bool:
    """What a pattern cannot check of a well-formed traceparent: not version ff, no all-zero
    trace or span id."""
    return (traceparent[:2] != "ff" and traceparent[3:35] != "0" * 32
            and traceparent[36:52] != "0" * 16)


def check_traceparent(value: str) -> str:
    """``value`` if it is a valid W3C traceparent (not version ff, no all-zero id), else
    ``ValueError`` naming what is wrong."""
    if TRACEPARENT_RE.fullmatch(value) is None:
        raise ValueError("traceparent must be a W3C traceparent "
                         f"'00-<32 hex>-<16 hex>-<2 hex>', got {value[:80]!r}")
    if not valid_ids(value):
        raise ValueError(f"traceparent has an invalid version or an all-zero id: {value!r}")
    return value


def check_tracestate(value: str) -> str:
    if len(value) > MAX_TRACESTATE or not TRACESTATE_RE.fullmatch(value):
        raise ValueError(f"tracestate must be at most {MAX_TRACESTATE} printable ASCII "
                         f"characters, got {len(value)}")
    return value


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex) of a valid traceparent, else None."""
    if traceparent is None or TRACEPARENT_RE.fullmatch(traceparent) is None:
        return None
    return traceparent[3:35]


class TraceFields(TypedDict, total=False):
    """``enqueue``'s trace keyword arguments."""

    traceparent: str
    tracestate: str


@dataclass(frozen=True, slots=True)
class Parent:
    """A W3C context as the headers carry it."""

    traceparent: str
    tracestate: str | None = None

    @classmethod
    def parse(cls, traceparent: str | None, tracestate: str | None = None) -> Parent | None:
        """From headers: None when absent or invalid (as W3C says: a bad traceparent is
        ignored, a new trace starts); a bad tracestate alone is dropped."""
        if not traceparent:
            return None
        try:
            check_traceparent(traceparent.strip().lower())
        except ValueError:
            return None
        state = tracestate.strip() if tracestate else None
        if state is not None:
            try:
                check_tracestate(state)
            except ValueError:
                state = None
        return cls(traceparent.strip().lower(), state or None)

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    def headers(self) -> dict[str, str]:
        """As W3C headers (what vLLM's ``trace_headers`` takes)."""
        out = {"traceparent": self.traceparent}
        if self.tracestate:
            out["tracestate"] = self.tracestate
        return out

    def fields(self) -> TraceFields:
        """As ``enqueue`` keyword arguments."""
        out: TraceFields = {"traceparent": self.traceparent}
        if self.tracestate:
            out["tracestate"] = self.tracestate
        return out


# ------------------------------------------------------------------------------ the switch

_tracer: Any = None
#: Settled: ``_tracer`` is final (an SDK set up, a provider joined, or disabled). Unsettled, a
#: global tracer provider that the application sets later turns tracing on.
_settled = False
_env_read = False
_service = "inferq"


def tracer() -> Any:
    """The tracer, or None when tracing is off. One global read when settled."""
    if _settled:
        return _tracer
    return _resolve()


def setup(service: str) -> Any:
    """Resolve now (a worker or gateway at start), with ``service`` as the default service
    name (``OTEL_SERVICE_NAME`` wins): the tracer or None. An exporter named in
    ``OTEL_TRACES_EXPORTER`` that inferq does not know is a ``ValidationError``."""
    global _service
    _service = service
    return tracer()


def use(provider: Any) -> Any:
    """Trace with ``provider`` (an SDK ``TracerProvider``; tests, or an application that
    passes its own); None turns tracing off. Returns the tracer."""
    global _tracer, _settled, _env_read
    _env_read = _settled = True
    _tracer = None if provider is None else provider.get_tracer(INSTRUMENTATION)
    return _tracer


def reset() -> None:
    """Forget the decision (tests): the next ``tracer()`` reads the environment again."""
    global _tracer, _settled, _env_read
    _tracer, _settled, _env_read = None, False, False


def _resolve() -> Any:
    global _tracer, _settled, _env_read
    if not _env_read:
        _env_read = True
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            _settled = True
            return None
        names = [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
                 if n.strip() and n.strip().lower() != "none"]
        if names:
            _tracer = _configure(names)
            _settled = True
            return _tracer
    api = sys.modules.get("opentelemetry.trace")
    # The application set a global provider: join it. (Only then: libraries such as redis-py
    # import OpenTelemetry's API without tracing anything.) Two lookups while unsettled.
    if api is not None and getattr(api, "_TRACER_PROVIDER", None) is not None:
        _tracer = api.get_tracer(INSTRUMENTATION)
        _settled = True
    return _tracer


def _configure(names: Sequence[str]) -> Any:
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ValidationError(f"OTEL_TRACES_EXPORTER: inferq sets up {', '.join(EXPORTERS)}, "
                              f"got {unknown[0]!r}", field="OTEL_TRACES_EXPORTER")
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed "
                    "(pip install 'inferq[otel]'): tracing is off")
        return None
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current.get_tracer(INSTRUMENTATION)
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": _service}
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing on: exporter %s, service %s", ",".join(names),
             os.environ.get("OTEL_SERVICE_NAME") or _service)
    return trace.get_tracer(INSTRUMENTATION)


def flush(timeout_s: float = 5.0) -> None:
    """Export what is buffered (a worker that stops; an SDK provider only)."""
    if _tracer is None:
        return
    from opentelemetry import trace
    provider = trace.get_tracer_provider()
    force = getattr(provider, "force_flush", None)
    if force is not None:
        force(int(timeout_s * 1e3))


# ------------------------------------------------------------------------- span helpers

def remote_context(traceparent: str | None, tracestate: str | None = None) -> Any:
    """An OpenTelemetry ``Context`` whose parent is this W3C context (None: no parent)."""
    if traceparent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def w3c_of(span: Any) -> Parent | None:
    """The W3C context of ``span`` (None for an invalid one: no-op tracer, no parent)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return Parent(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}",
                  state[:MAX_TRACESTATE] or None)


def current_parent() -> Parent | None:
    """The caller's current OpenTelemetry context (tracing on), else None."""
    if tracer() is None:
        return None
    from opentelemetry import trace
    return w3c_of(trace.get_current_span())


#: GenAI semantic conventions: ``gen_ai.operation.name`` of each built-in task.
OPERATIONS = {"embed": "embeddings", "generate": "text_completion", "score": "score"}


def request_attributes(task: str, model: str, priority: int, tenant: str | None
                       ) -> dict[str, Any]:
    """What every span of a request says about it (messaging and GenAI conventions)."""
    attributes: dict[str, Any] = {
        "messaging.system": "inferq", "messaging.destination.name": f"{task}:{model}",
        "gen_ai.request.model": model,
        "gen_ai.operation.name": OPERATIONS.get(task, task),
        "inferq.priority": priority,
    }
    if tenant:
        attributes["inferq.tenant"] = tenant
    return attributes


@contextmanager
def enqueue_span(tracer: Any, name: str, first: Mapping[str, Any], count: int,
                 parent: Parent | None, links: Sequence[Parent] = ()) -> Iterator[Any]:
    """A producer span around an enqueue of ``count`` requests (``first``: the first one's
    ``enqueue`` arguments), child of ``parent`` or of the current context, whose context the
    payloads then carry; linked to ``links``, the contexts that requests of an
    ``enqueue_many`` carry of their own. An exception ends it with an error status."""
    from opentelemetry import trace
    attributes = request_attributes(first.get("task", "embed"), str(first.get("model", "")),
                                    first.get("priority") or 0, first.get("tenant"))
    attributes["messaging.operation.type"] = "send"
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    context = None if parent is None else remote_context(parent.traceparent, parent.tracestate)
    span_links = [trace.Link(trace.get_current_span(
        remote_context(p.traceparent, p.tracestate)).get_span_context())
        for p in links[:MAX_LINKS]]
    with tracer.start_as_current_span(name, context=context, kind=trace.SpanKind.PRODUCER,
                                      attributes=attributes, links=span_links) as span:
        yield span


@contextmanager
def server_span(tracer: Any, name: str, parent: Parent | None,
                attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A ``SERVER`` span (an HTTP call), child of ``parent`` (a new trace without one), current
    while the call runs."""
    from opentelemetry.trace import SpanKind
    context = None if parent is None else remote_context(parent.traceparent, parent.tracestate)
    if context is None:
        from opentelemetry.context import Context
        context = Context()  # the caller's context alone decides; none: a new trace
    with tracer.start_as_current_span(name, context=context, kind=SpanKind.SERVER,
                                      attributes=dict(attributes)) as span:
        yield span


def error_status(description: str) -> Any:
    from opentelemetry.trace import Status, StatusCode
    return Status(StatusCode.ERROR, description)


