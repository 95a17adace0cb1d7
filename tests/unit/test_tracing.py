"""The trace context in the payload (bounded, validated) and how tracing is switched on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from inferq import tracing
from inferq.errors import ValidationError
from inferq.protocol.codec import build_request, decode_request, encode_request

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_payload_carries_a_valid_context_and_leaves_it_out_when_absent() -> None:
    plain = build_request("hi", id="a", task="embed", model="m")
    assert b"traceparent" not in encode_request(plain)
    traced = build_request("hi", id="a", task="embed", model="m", traceparent=TP,
                           tracestate="vendor=x")
    back = decode_request(encode_request(traced))
    assert (back.traceparent, back.tracestate) == (TP, "vendor=x")


@pytest.mark.parametrize("bad", [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    TP + "x" * 200,
    TP + "\n",
])
def test_a_bad_traceparent_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ValidationError) as err:
        build_request("hi", id="a", task="embed", model="m", traceparent=bad)
    assert "traceparent" in str(err.value)


def test_tracestate_is_bounded_and_printable() -> None:
    for bad in ("k=" + "v" * tracing.MAX_TRACESTATE, "k=\u00e9", "k=\n"):
        with pytest.raises(ValidationError, match="tracestate"):
            build_request("hi", id="a", task="embed", model="m", traceparent=TP,
                          tracestate=bad)


def test_headers_are_parsed_leniently_as_w3c_says() -> None:
    parent = tracing.Parent.parse(f" {TP.upper()} ", "a=1")
    assert parent == tracing.Parent(TP, "a=1")
    assert parent.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert tracing.Parent.parse("garbage") is None  # ignored: a new trace starts
    assert tracing.Parent.parse(TP, "\x01") == tracing.Parent(TP, None)  # bad state dropped
    assert tracing.trace_id_of(TP) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert tracing.trace_id_of(None) is None


def _run(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**clean, **env},
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_off_by_default_and_nothing_of_the_sdk_imported() -> None:
    out = _run("""
        import sys
        import redis  # redis-py imports parts of OpenTelemetry's API itself, when installed
        before = {m for m in sys.modules if m.startswith("opentelemetry")}
        from inferq import tracing
        from inferq.producer.options import ClientOptions
        from inferq.producer.prepare import prepare
        from inferq.worker.window import worker
        assert tracing.tracer() is None
        prepare("hi", {"model": "m"}, ClientOptions())
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")
                     and m not in before))
    """)
    assert out == "[]"


def test_the_environment_turns_it_on_or_off() -> None:
    code = """
        from inferq import tracing
        from opentelemetry import trace
        t = tracing.setup("svc")
        print(t is not None, type(trace.get_tracer_provider()).__name__,
              trace.get_tracer_provider().resource.attributes.get("service.name")
              if t is not None else "-")
    """
    assert _run(code, OTEL_TRACES_EXPORTER="console") == "True TracerProvider svc"
    assert _run(code, OTEL_TRACES_EXPORTER="console",
                OTEL_SERVICE_NAME="mine") == "True TracerProvider mine"
    assert _run(code, OTEL_TRACES_EXPORTER="console", OTEL_SDK_DISABLED="true").startswith(
        "False")
    assert _run(code, OTEL_TRACES_EXPORTER="none").startswith("False")
    assert _run(code).startswith("False")


def test_an_unknown_exporter_is_named() -> None:
    with pytest.raises(subprocess.CalledProcessError) as err:
        _run("from inferq import tracing; tracing.setup('x')", OTEL_TRACES_EXPORTER="zipkin")
    assert "zipkin" in err.value.stderr


def test_an_application_provider_is_joined() -> None:
    out = _run("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from inferq import tracing
        assert tracing.tracer() is None
        trace.set_tracer_provider(TracerProvider())
        with trace.get_tracer("app").start_as_current_span("handler") as span:
            parent = tracing.current_parent()
            print(parent.trace_id == f"{span.get_span_context().trace_id:032x}")
    """)
    assert out == "True"


def _claim(request_id: str, traceparent: str | None, attempt: int = 1) -> Any:
    from inferq.protocol import ops
    from inferq.protocol.codec import RequestPayload
    from inferq.worker.core.results import Claim
    claimed = ops.Claimed(id=request_id, payload=b"", token="t", attempt=attempt,
                          enqueued_ms=1_700_000_000_000, deadline_ms=None)
    return Claim(claimed, RequestPayload(id=request_id, task="embed", model="m", prompt="p",
                                         traceparent=traceparent),
                 0.0, None, 1_700_000_000_250)


def test_worker_spans_follow_the_parents_sampling_and_end_once() -> None:
    from inferq.connection import ConnectionSettings
    from inferq.protocol import ops
    from inferq.worker.core.config import WorkerConfig
    from inferq.worker.core.traces import WorkerTraces
    from tests.support.traces import events, named, traced, traceparent

    config = WorkerConfig(connection=ConnectionSettings("redis://127.0.0.1:1/0"),
                          model_name="m", model_spec="builtin:echo", worker_id="w1")
    unsampled = TP[:-2] + "00"
    with traced() as spans:
        traces = WorkerTraces(tracing.tracer(), config, lambda: 1_700_000_000_500_000_000)
        claims = [_claim("a", TP), _claim("b", unsampled), _claim("c", None, attempt=2)]
        traces.claimed(claims)
        assert set(traces.open) == {"a", "c"}  # b's parent was not sampled: not followed
        headers = traces.headers("a")  # what vLLM continues: the run span
        assert traces.headers("b") is None
        traces.group("batch", ["a", "b", "c"], 1, 2, {"inferq.batch.id": 7},
                     {"inferq.batch.id": 7})
        done = [ops.Completion(claims[0].claimed, "ok", b"", prompt_tokens=4),
                ops.Completion(claims[2].claimed, "retry", b"", retry_delay_ms=5)]
        traces.completed(done, [True, True])
        traces.completed(done, [True, True])  # a second end is a no-op
        assert traces.open == {}
    finished = spans.get_finished_spans()
    assert len(named(finished, "queue wait")) == 2 and len(named(finished, "run")) == 2
    (batch,) = named(finished, "batch")
    assert len(batch.links) == 2 and batch.parent is None
    a, c = sorted(named(finished, "run"), key=lambda s: s.attributes["messaging.message.id"])
    assert a.parent is not None and a.parent.span_id == int(TP[36:52], 16)
    assert headers == {"traceparent": traceparent(a)}
    assert a.attributes["gen_ai.usage.input_tokens"] == 4 and a.attributes["inferq.batch.id"] == 7
    assert c.parent is None and events(c) == ["resumed", "retry"]
    assert c.status.status_code.name == "ERROR"
