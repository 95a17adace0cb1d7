"""A worker's spans (docs/guides/tracing.md): built only when tracing is on (``inferq.tracing``);
off, the worker holds None instead of a ``WorkerTraces`` and no hook runs.

Each claimed request continues the trace its payload carries (a new trace when it carries
none): a ``queue wait`` span from its enqueue to this claim, both on Redis' clock, and a
``run`` span for this attempt, from the claim to its result, whose events say what happened
(``started``, ``first token``, ``preempted``, ``retry``, ``dead letter``, ``expired``,
``cancelled``, ``released``, ``lease lost``; ``resumed`` when an earlier run had failed or
was lost with its worker).
A batch (window worker) or an admission into the running batch (generate worker) is a span
of its own, linked to each request's ``run`` span rather than parenting them: a batch
belongs to many traces. The ``run`` span names its batch (``inferq.batch.id``), or has an
``admit`` event at its admission's step (its prefill).

What it costs (benchmarks/RESULTS.md, "#38"): the SDK's spans and the OTLP
encoding are pure Python, so every attribute and event is paid for twice; the spans carry
what a reader of one trace needs and no more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from inferq import tracing
from inferq.protocol import ops
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.results import Claim

log = logging.getLogger("inferq.worker")

#: Open ``run`` spans kept at most; beyond, the oldest is ended (``untracked``): a request
#: whose end this worker never saw (its lease lost unnoticed) cannot grow the map forever.
MAX_OPEN = 65_536
#: The event a completion's status puts on the run span (ok and failed: the span status).
STATUS_EVENTS = {"retry": "retry", "dead": "dead letter", "expired": "expired",
                 "cancelled": "cancelled"}


def ms_ns(ms: float) -> int:
    return int(ms * 1_000_000)


class WorkerTraces:
    """The open ``run`` span of each request in hand, by request id."""

    def __init__(self, tracer: Any, config: WorkerConfig,
                 now_ns: Callable[[], int]) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode
        self.tracer = tracer
        self.config = config
        self.now_ns = now_ns
        self._consumer, self._internal = SpanKind.CONSUMER, SpanKind.INTERNAL
        self._status, self._code = Status, StatusCode
        from opentelemetry.context import Context
        from opentelemetry.sdk.trace.sampling import ParentBased
        #: A context with no span in it: a group span starts a trace of its own.
        self._root = Context()
        #: A parent-based sampler (the default) records nothing under an unsampled parent:
        #: such a request is not followed at all (no spans that would record nothing).
        self._skip_unsampled = isinstance(getattr(tracer, "sampler", None), ParentBased)
        self.open: dict[str, Any] = {}

    def claimed(self, claims: Sequence[Claim]) -> None:
        """Each claim's ``queue wait`` span (ended) and its ``run`` span (open)."""
        worker = self.config.worker_id
        # Requests of one enqueue_many share their parent: its context is made once.
        parents: dict[tuple[str | None, str | None], Any] = {}
        for claim in claims:
            c, payload = claim.claimed, claim.payload
            if (self._skip_unsampled and payload.traceparent is not None
                    and not int(payload.traceparent[-2:], 16) & 1):
                if (previous := self.open.pop(c.id, None)) is not None:
                    previous.end()
                continue
            key = (payload.traceparent, payload.tracestate)
            parent = parents.get(key)
            if parent is None:
                parent = parents[key] = tracing.remote_context(*key)
            # Attributes cost CPU twice (recorded, then encoded by the exporter): the queue
            # wait carries the id alone, its sibling run span says the rest.
            enqueued_ns, claimed_ns = ms_ns(c.enqueued_ms), ms_ns(claim.claimed_ms)
            self.tracer.start_span(
                "queue wait", context=parent, kind=self._internal,
                attributes={"messaging.message.id": c.id},
                start_time=enqueued_ns).end(end_time=max(claimed_ns, enqueued_ns))
            attributes = tracing.request_attributes(payload.task, payload.model,
                                                    payload.priority, payload.tenant)
            attributes.update({"messaging.message.id": c.id, "inferq.attempt": c.attempt,
                               "inferq.worker": worker})
            span = self.tracer.start_span("run", context=parent, kind=self._consumer,
                                          attributes=attributes, start_time=claimed_ns)
            earlier = c.attempt - 1 + c.lost  # failed runs, and runs lost with a worker
            if earlier:
                span.add_event("resumed", {"inferq.attempt": c.attempt,
                                           "inferq.earlier_runs": earlier,
                                           "inferq.lost_runs": c.lost},
                               timestamp=claimed_ns)
            previous = self.open.pop(c.id, None)
            if previous is not None:  # claimed again by this worker: the old one is over
                previous.end()
            self.open[c.id] = span
        while len(self.open) > MAX_OPEN:
            try:
                oldest = next(iter(self.open))
            except RuntimeError:  # the loop thread ended one meanwhile: look again
                continue
            self._end(oldest, "untracked")

    def started(self, ids: Iterable[str]) -> None:
        now = self.now_ns()
        for request_id in ids:
            if (span := self.open.get(request_id)) is not None:
                span.add_event("started", timestamp=now)

    def event(self, request_id: str, name: str, attributes: Mapping[str, Any] | None = None,
              at_ns: int | None = None) -> None:
        if (span := self.open.get(request_id)) is not None:
            span.add_event(name, dict(attributes or {}), timestamp=at_ns or self.now_ns())

    def annotate(self, request_id: str, attributes: Mapping[str, Any]) -> None:
        if (span := self.open.get(request_id)) is not None:
            span.set_attributes(dict(attributes))

    def headers(self, request_id: str) -> dict[str, str] | None:
        """The W3C headers of a request's open ``run`` span (what an engine that traces
        continues), or None."""
        span = self.open.get(request_id)
        parent = None if span is None else tracing.w3c_of(span)
        return None if parent is None else parent.headers()

    def completed(self, completions: Sequence[ops.Completion],
                  written: Sequence[bool] | None) -> None:
        """End each completion's ``run`` span: its outcome as an event or the span status;
        a completion refused by Redis (lease lost, cancelled meanwhile) says so."""
        now = self.now_ns()
        for i, done in enumerate(completions):
            span = self.open.pop(done.id, None)
            if span is None:
                continue
            status = done.status
            span.set_attribute("inferq.status", status)
            if done.prompt_tokens:
                span.set_attribute("gen_ai.usage.input_tokens", done.prompt_tokens)
            if done.completion_tokens:
                span.set_attribute("gen_ai.usage.output_tokens", done.completion_tokens)
            if written is None:
                span.add_event("result not written", timestamp=now)
            elif not written[i]:
                span.add_event("lease lost", {"inferq.refused_status": status},
                               timestamp=now)
            elif (event := STATUS_EVENTS.get(status)) is not None:
                attributes: dict[str, Any] = {"inferq.attempt": done.claimed.attempt}
                if status == "retry":
                    attributes["inferq.retry_delay_ms"] = done.retry_delay_ms
                span.add_event(event, attributes, timestamp=now)
            if status in ("failed", "dead", "expired") or status == "retry":
                span.set_status(self._status(self._code.ERROR, status))
            span.end(end_time=now)

    def ended(self, ids: Iterable[str], why: str,
              attributes: Mapping[str, Any] | None = None) -> None:
        """End the ``run`` spans of requests this worker let go without a result of its own
        (given back, cancelled, lease lost), with ``why`` as their last event."""
        for request_id in ids:
            self._end(request_id, why, attributes)

    def _end(self, request_id: str, why: str,
             attributes: Mapping[str, Any] | None = None) -> None:
        span = self.open.pop(request_id, None)
        if span is not None:
            now = self.now_ns()
            span.add_event(why, dict(attributes or {}), timestamp=now)
            span.end(end_time=now)

    def group(self, name: str, ids: Sequence[str], start_ns: int, end_ns: int,
              attributes: Mapping[str, Any], on_runs: Mapping[str, Any],
              event: bool = False) -> None:
        """A span for work done together (a batch, an admission), linked to each request's
        ``run`` span: the root of a trace of its own. Each ``run`` span gets ``on_runs`` (which
        group it was in): as attributes, or with ``event`` as an event of the same name at the
        group's start (an admission: when its prefill ran)."""
        from opentelemetry.trace import Link
        runs = [span for request_id in ids if (span := self.open.get(request_id)) is not None]
        for run in runs:
            if event:
                run.add_event(name, dict(on_runs), timestamp=start_ns)
            else:
                run.set_attributes(dict(on_runs))
        links = [Link(run.get_span_context()) for run in runs]
        span = self.tracer.start_span(
            name, context=self._root, kind=self._internal, links=links, start_time=start_ns,
            attributes={"messaging.system": "inferq",
                        "messaging.destination.name": self.config_queue,
                        "messaging.batch.message_count": len(ids),
                        "inferq.worker": self.config.worker_id, **attributes})
        span.end(end_time=max(end_ns, start_ns))

    @property
    def config_queue(self) -> str:
        return f"{self.config.task}:{self.config.model_name}"


def make(config: WorkerConfig, now_ns: Callable[[], int]) -> WorkerTraces | None:
    """The worker's traces when tracing is on (``inferq.tracing.setup``), else None."""
    tracer = tracing.setup("inferq-worker")
    return None if tracer is None else WorkerTraces(tracer, config, now_ns)
