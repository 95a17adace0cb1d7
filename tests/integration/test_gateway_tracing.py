"""W3C Trace Context through the gateway: ``traceparent`` in, ``X-Trace-Id`` out, and with
tracing on one trace from the HTTP call to the worker's spans."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from fastapi.testclient import TestClient

from inferq.models import Model, ModelInput
from inferq.protocol.codec import decode_request
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys
from inferq.worker.window.worker import WindowWorker
from tests.support.batch import EMBED, embed_line, jsonl
from tests.support.gateway import ECHO, MakeApi
from tests.support.processes import wait_until
from tests.support.traces import attr, named, parent_id, trace_hex, traced
from tests.support.window_worker import config

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE = TP[3:35]


class Vectors(Model):
    tasks = frozenset({"embed"})

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        return [[float(len(item.data)), 0.5] for item in batch]


@contextmanager
def worker(redis_url: str) -> Iterator[None]:
    """An in-process window worker on ``embed:t`` (its own thread and loop), stopped (every
    span ended) when the block ends."""
    w = WindowWorker(config(redis_url), Vectors())
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(w.run(install_signal_handlers=False)),
        daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(w.request_stop)
        thread.join(timeout=30)


def payload_of(r: redis.Redis, keys: QueueKeys, request_id: str) -> Any:
    raw = r.hget(keys.request(request_id), Field.PAYLOAD)
    assert isinstance(raw, bytes)
    return decode_request(raw)


def test_off_the_callers_context_is_carried_and_its_trace_named(api: TestClient,
                                                                r: redis.Redis) -> None:
    queued = api.post("/v1/requests", json={"prompt": "x", "model": "echo"},
                      headers={"traceparent": TP, "tracestate": "k=v"})
    assert queued.status_code == 202 and queued.headers["X-Trace-Id"] == TRACE
    payload = payload_of(r, ECHO, queued.json()["id"])
    assert (payload.traceparent, payload.tracestate) == (TP, "k=v")
    plain = api.post("/v1/requests", json={"prompt": "x", "model": "echo"},
                     headers={"traceparent": "not a traceparent"})
    assert plain.status_code == 202 and "X-Trace-Id" not in plain.headers
    assert payload_of(r, ECHO, plain.json()["id"]).traceparent is None


def test_on_one_trace_from_the_http_call_to_the_worker(make_api: MakeApi,
                                                       redis_url: str) -> None:
    with traced() as spans, worker(redis_url), make_api() as api:
        embedded = api.post("/v1/embeddings", json={"input": ["a", "bb"], "model": "t"},
                            headers={"traceparent": TP})
        native = api.post("/v1/requests?wait=true", json={"prompt": "abc", "model": "t"})
        assert api.get("/healthz").status_code == 200  # probes make no spans
    assert embedded.status_code == 200 and native.status_code == 200, native.text
    assert embedded.headers["X-Trace-Id"] == TRACE
    finished = spans.get_finished_spans()
    servers = {attr(s, "url.path"): s for s in finished if s.name.startswith("POST")}
    assert not [s for s in finished if s.name.startswith("GET")]
    embed_call, native_call = servers["/v1/embeddings"], servers["/v1/requests"]
    assert trace_hex(embed_call) == TRACE and parent_id(embed_call) == int(TP[36:52], 16)
    assert attr(embed_call, "http.response.status_code") == 200
    # a new trace for the call without a traceparent, named in its answer
    assert native_call.parent is None and native.headers["X-Trace-Id"] == trace_hex(native_call)
    runs: dict[str, list[Any]] = {}
    for run in named(finished, "run"):
        runs.setdefault(trace_hex(run), []).append(run)
    # embeddings: coalesced with other calls' inputs, each input carries its call's span
    assert [parent_id(s) for s in runs[TRACE]] == [embed_call.context.span_id] * 2
    # native: the SDK's enqueue span under the call, the worker's run under it
    (enqueue,) = [s for s in named(finished, "enqueue") if trace_hex(s) == trace_hex(native_call)]
    assert parent_id(enqueue) == native_call.context.span_id
    (run,) = runs[trace_hex(native_call)]
    assert parent_id(run) == enqueue.context.span_id
    assert no_dangling_parents(finished)


def no_dangling_parents(finished: Sequence[Any]) -> bool:
    """Every span the worker continued is one that exists (no dangling parent)."""
    ids = {s.context.span_id for s in finished}
    return all(parent_id(s) in ids for s in finished
               if s.name in ("run", "queue wait") and parent_id(s) != int(TP[36:52], 16))


def test_batch_lines_carry_the_trace_of_the_call_that_created_the_batch(
        make_api: MakeApi, r: redis.Redis, tmp_path: Path) -> None:
    with make_api(file_store=str(tmp_path / "files"), batch_idle_s=0.2) as api:
        uploaded = api.post("/v1/files", data={"purpose": "batch"}, files={
            "file": ("in.jsonl", jsonl([embed_line("a", "x"), embed_line("b", "yy")]))})
        created = api.post("/v1/batches", headers={"traceparent": TP}, json={
            "input_file_id": uploaded.json()["id"], "endpoint": "/v1/embeddings",
            "completion_window": "24h"})
        assert created.status_code == 200 and created.headers["X-Trace-Id"] == TRACE
        wait_until(lambda: r.zcard(EMBED.pending) == 2, 30, "the batch's lines to be queued")
    lines = [m.decode() for m in r.zrange(EMBED.pending, 0, -1)]
    assert {payload_of(r, EMBED, line).traceparent for line in lines} == {TP}
