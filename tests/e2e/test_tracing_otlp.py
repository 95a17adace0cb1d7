"""One trace from the caller to the result, over real processes: the test is the producer
(its SDK, and a gateway it serves over HTTP), two ``inferq worker`` processes export OTLP over
HTTP to a receiver the test runs; the first worker is SIGKILLed mid-run, the second runs the
request again. Asserted: one trace id from the caller's span to the last attempt, the parents
(caller > enqueue > queue wait / run), the batch span linked to the run rather than
parenting it, and the attempts' events."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from pydantic import SecretStr

import inferq
from inferq import tracing
from inferq.gateway import GatewaySettings
from inferq.producer.options import ClientOptions
from inferq.protocol.keys import QueueKeys
from tests.support.gateway import TOKEN, auth, serve
from tests.support.otlp import Receiver, Span, receiver
from tests.support.processes import WorkerProcess, wait_until

KEYS = QueueKeys.for_model("embed", "slow")
SLOW = "slow=builtin:sleep?batch_ms=1500"


@pytest.fixture
def otlp() -> Iterator[tuple[Receiver, str]]:
    """The receiver, and this process traced into it (service ``producer``)."""
    with receiver() as (got, endpoint):
        provider = TracerProvider(resource=Resource.create({"service.name": "producer"}))
        provider.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=5)))
        tracing.use(provider)
        try:
            yield got, endpoint
        finally:
            tracing.use(None)
            provider.shutdown()


def one(spans: list[Span], **match: str) -> Span:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


@pytest.mark.timeout(120)
def test_one_trace_from_the_caller_through_a_crash_to_the_result(
        otlp: tuple[Receiver, str], redis_url: str, r: redis.Redis,
        start_worker: Callable[..., WorkerProcess]) -> None:
    got, endpoint = otlp

    def worker(name: str) -> WorkerProcess:
        return start_worker(
            "--model", SLOW, "--lease-ms", "1500", "--worker-id", name,
            env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                 "OTEL_SERVICE_NAME": name, "OTEL_BSP_SCHEDULE_DELAY": "50"})

    client = inferq.Client(redis_url, options=ClientOptions(warn_no_worker=False))
    tracer = tracing.tracer()
    with tracer.start_as_current_span("caller") as caller:
        handle = client.enqueue("crash me", model="slow")
    trace_id = f"{caller.get_span_context().trace_id:032x}"
    doomed = worker("doomed")
    # Killed mid-run: its run span never ends, but its queue wait was exported at the claim.
    wait_until(lambda: r.scard(KEYS.started) > 0, 60, "the first worker's forward")
    got.wait_for(lambda spans: any(s.service == "doomed" for s in spans), 30,
                 "the first worker's queue wait span")
    doomed.proc.send_signal(signal.SIGKILL)
    doomed.proc.wait(timeout=10)
    survivor = worker("survivor")
    result = handle.result(timeout=60)
    # the run lost with the first worker is counted apart from attempts (failure-handling guide)
    assert (result.attempts, result.lost_runs, result.trace_id) == (1, 1, trace_id)
    # The same through the gateway: the HTTP call's traceparent, the answer's X-Trace-Id.
    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               timeout_s=60, require_served_model=False)
    with tracer.start_as_current_span("http caller") as http_caller, serve(settings) as url:
        ctx = http_caller.get_span_context()
        answer = httpx.post(f"{url}/requests?wait=true", headers={
            **auth(), "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"},
            json={"prompt": "via http", "model": "slow"}, timeout=60)
    assert answer.status_code == 200, answer.text
    http_trace = f"{ctx.trace_id:032x}"
    assert answer.headers["X-Trace-Id"] == http_trace
    assert survivor.stop() == 0  # a clean stop exports what is left
    client.close()

    spans = got.wait_for(
        lambda spans: sum(s.name == "run" for s in spans) >= 2, 30, "the survivor's runs")
    mine = [s for s in spans if s.trace_id == trace_id]
    root = one(mine, name="caller", service="producer")
    enqueue = one(mine, name="enqueue", service="producer")
    assert enqueue.parent_id == root.span_id
    waits = [s for s in mine if s.name == "queue wait"]
    assert {s.service for s in waits} == {"doomed", "survivor"}
    assert all(s.parent_id == enqueue.span_id for s in waits)
    run = one(mine, name="run")  # the killed attempt's run never ended: never exported
    # the lost run was not an attempt (failure-handling guide): the survivor's run is attempt 1
    assert (run.service, run.parent_id, run.attributes["inferq.attempt"]) == (
        "survivor", enqueue.span_id, 1)
    assert run.events[:2] == ("resumed", "started")
    assert run.attributes["inferq.status"] == "ok"
    batch = next(s for s in spans if s.name == "batch" and (trace_id, run.span_id) in s.links)
    assert batch.trace_id != trace_id and batch.parent_id == ""
    assert run.attributes["inferq.batch.id"] == batch.attributes["inferq.batch.id"]
    # the gateway call: caller > POST span > enqueue > run, in the caller's trace
    http = [s for s in spans if s.trace_id == http_trace]
    server = one(http, name="POST /v1/requests")
    assert server.parent_id == http_caller.get_span_context().span_id.to_bytes(8).hex()
    http_enqueue = one(http, name="enqueue")
    assert http_enqueue.parent_id == server.span_id
    assert one(http, name="run").parent_id == http_enqueue.span_id
