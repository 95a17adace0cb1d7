"""Spans across the queue, kept in memory: the producer's ``enqueue`` span, the worker's
``queue wait`` and ``run`` spans in the same trace, and the batch span linked to them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import inferq
from inferq import tracing
from inferq.cli.main import main
from inferq.protocol.codec import RequestPayload, decode_request
from inferq.protocol.fields import Field
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.window.worker import WindowWorker
from tests.support.traces import (
    attr,
    events,
    named,
    parent_id,
    trace_hex,
    traced,
    traceparent,
)
from tests.support.window_worker import KEYS, config, run_worker, stop

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with traced() as exporter:
        yield exporter


def stored(r: Any, request_id: str) -> RequestPayload:
    return decode_request(r.hget(KEYS.request(request_id), Field.PAYLOAD))


def test_enqueue_is_a_producer_span_whose_context_the_payload_carries(
        client: inferq.Client, r: Any, spans: InMemorySpanExporter) -> None:
    with tracing.tracer().start_as_current_span("handler") as app:
        handle = client.enqueue("hi", model="t", priority=3, tenant="acme")
    (enqueue,) = named(spans.get_finished_spans(), "enqueue")
    assert enqueue.kind is trace.SpanKind.PRODUCER
    assert parent_id(enqueue) == app.get_span_context().span_id
    assert attr(enqueue, "messaging.destination.name") == "embed:t"
    assert attr(enqueue, "gen_ai.request.model") == "t"
    assert attr(enqueue, "inferq.priority") == 3 and attr(enqueue, "inferq.tenant") == "acme"
    assert attr(enqueue, "messaging.message.id") == handle.id
    payload = stored(r, handle.id)
    assert payload.traceparent == traceparent(enqueue)


def test_an_explicit_traceparent_is_the_parent(client: inferq.Client, r: Any,
                                               spans: InMemorySpanExporter) -> None:
    handle = client.enqueue("hi", model="t", traceparent=TP, tracestate="v=1")
    (enqueue,) = named(spans.get_finished_spans(), "enqueue")
    assert trace_hex(enqueue) == TP[3:35] and parent_id(enqueue) == int(TP[36:52], 16)
    payload = stored(r, handle.id)
    assert payload.traceparent is not None and payload.traceparent[3:35] == TP[3:35]
    assert payload.tracestate == "v=1"


def request_cli(redis_url: str, request_id: str,
                capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["request", request_id, "--redis-url", redis_url]) == 0
    return capsys.readouterr().out


def test_off_an_explicit_traceparent_is_carried_as_it_is(
        client: inferq.Client, r: Any, redis_url: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    handle = client.enqueue("hi", model="t", traceparent=TP)
    assert stored(r, handle.id).traceparent == TP
    # a waiting request's trace is read from its payload
    assert f"trace      {TP[3:35]}" in request_cli(redis_url, handle.id, capsys)
    with pytest.raises(inferq.ValidationError, match="traceparent"):
        client.enqueue("hi", model="t", traceparent="nope")


def test_enqueue_many_is_one_span_every_request_carries(
        client: inferq.Client, r: Any, spans: InMemorySpanExporter) -> None:
    handles = client.enqueue_many(["a", "b", {"prompt": "c", "priority": 2}], model="t")
    (span,) = named(spans.get_finished_spans(), "enqueue_many")
    assert attr(span, "messaging.batch.message_count") == 3
    assert {stored(r, h.id).traceparent for h in handles} == {traceparent(span)}


def test_enqueue_many_links_the_contexts_requests_carry_of_their_own(
        client: inferq.Client, r: Any, spans: InMemorySpanExporter) -> None:
    own = {"prompt": "b", "traceparent": TP}
    handles = client.enqueue_many(["a", own, dict(own, prompt="c")], model="t")
    (span,) = named(spans.get_finished_spans(), "enqueue_many")
    assert [(f"{link.context.trace_id:032x}", link.context.span_id) for link in span.links] \
        == [(TP[3:35], int(TP[36:52], 16))]  # once, though two requests carry it
    assert [stored(r, h.id).traceparent for h in handles] == [traceparent(span), TP, TP]
    for bad in ({"prompt": "x"}, 5):  # refused as with tracing off
        with pytest.raises(inferq.ValidationError, match="requests must be a list"):
            client.enqueue_many(bad, model="t")  # type: ignore[arg-type]


class Flaky(BatchModel):
    """Echo; the first run of 'flaky' fails (retried), 'bad' always fails."""

    tasks = frozenset({"*"})
    model_id = "flaky"

    def __init__(self) -> None:
        self.failed = False

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[Any]:
        return [ModelInput(len(p.prompt), p.prompt) for p in payloads]

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        texts = [item.data for item in batch]
        if "flaky" in texts and not self.failed:
            self.failed = True
            raise RuntimeError("transient")
        return texts


async def test_worker_spans_continue_the_trace_on_every_attempt(
        redis_url: str, aclient: inferq.AsyncClient, spans: InMemorySpanExporter,
        capsys: pytest.CaptureFixture[str]) -> None:
    handles = await aclient.enqueue_many(["x", "y"], model="t")
    worker = WindowWorker(config(redis_url, retry_base_ms=1), Flaky())
    task = await run_worker(worker)
    results = await asyncio.gather(*(h.result(timeout=30) for h in handles))
    flaky = await aclient.enqueue("flaky", model="t")  # alone: its failure is its own
    results.append(await flaky.result(timeout=30))
    await stop(worker, task)
    assert [r.output for r in results] == ["x", "y", "flaky"]
    finished = spans.get_finished_spans()
    (many,) = named(finished, "enqueue_many")
    runs = named(finished, "run")
    waits = named(finished, "queue wait")
    # x and y: one attempt each, in the producer's trace, children of its span
    for request in handles:
        (run,) = [s for s in runs if attr(s, "messaging.message.id") == request.id]
        (wait,) = [s for s in waits if attr(s, "messaging.message.id") == request.id]
        assert trace_hex(run) == trace_hex(wait) == trace_hex(many)
        assert parent_id(run) == parent_id(wait) == many.context.span_id
        assert run.kind is trace.SpanKind.CONSUMER and attr(run, "inferq.attempt") == 1
        assert events(run)[:1] == ["started"] and attr(run, "inferq.batch.size") == 2
        assert wait.start_time <= wait.end_time <= run.start_time  # Redis' clock
        assert attr(run, "inferq.status") == "ok"
    # flaky: two attempts in its own trace, the first ending with a retry event
    (enqueue,) = named(finished, "enqueue")
    attempts = sorted((s for s in runs if attr(s, "messaging.message.id") == flaky.id),
                      key=lambda s: attr(s, "inferq.attempt"))
    assert [attr(s, "inferq.attempt") for s in attempts] == [1, 2]
    assert {trace_hex(s) for s in attempts} == {trace_hex(enqueue)}
    assert "retry" in events(attempts[0]) and attempts[0].status.status_code.name == "ERROR"
    assert "resumed" in events(attempts[1]) and attr(attempts[1], "inferq.status") == "ok"
    # batches: traces of their own, linked to the runs they ran
    batches = named(finished, "batch")
    linked = {link.context.span_id for b in batches for link in b.links}
    assert {s.context.span_id for s in runs} <= linked
    assert all(b.parent is None and trace_hex(b) != trace_hex(many) for b in batches)
    # the results name their trace, and so does ``inferq request``
    assert [r.trace_id for r in results] == [trace_hex(many)] * 2 + [trace_hex(enqueue)]
    out = request_cli(redis_url, flaky.id, capsys)
    assert f"trace      {trace_hex(enqueue)}" in out and "attempts   2" in out


async def test_a_generation_has_admission_first_token_and_finish(
        redis_url: str, gen_worker: Callable[..., Any], aclient: inferq.AsyncClient,
        spans: InMemorySpanExporter) -> None:
    await gen_worker()
    handle = await aclient.enqueue("hello", model="tiny", task="generate",
                                   params={"max_new_tokens": 5, "ignore_eos": True})
    result = await handle.result(timeout=60)
    # The run span ends once the worker has the reply of the write that the result came in.
    async with asyncio.timeout(10):
        while not named(spans.get_finished_spans(), "run"):
            await asyncio.sleep(0.01)
    (run,) = named(spans.get_finished_spans(), "run")
    (admit,) = named(spans.get_finished_spans(), "admit")
    assert [link.context.span_id for link in admit.links] == [run.context.span_id]
    story = ("started", "admit", "first token")
    assert [e for e in events(run) if e in story] == list(story)
    assert attr(run, "gen_ai.response.finish_reasons") == ("length",)
    assert attr(run, "gen_ai.usage.output_tokens") == 5
    assert attr(run, "gen_ai.usage.input_tokens") == result.usage.prompt_tokens
