"""Through a real gateway (uvicorn) and a generate worker on the tiny Llama, over HTTP: content
parts, X-Request-Id, log-probabilities, usage in streams, and resumable streams (every event's
``id:``, ``Last-Event-ID`` on ``GET /v1/requests/{id}/stream`` from any point: no duplicate,
nothing missing)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.gateway import CHAT, auth
from tests.support.generation import MODEL

pytestmark = pytest.mark.timeout(180)

Event = tuple[str | None, str]  # (id, data)


def parse_events(raw: str) -> list[Event]:
    """Server-sent events as a spec-following client reads them."""
    events: list[Event] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        event_id, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "id":
                event_id = value
            elif field == "data":
                data.append(value)
        events.append((event_id, "\n".join(data)))
    return events


def same(data: str) -> Any:
    """An event's content without its ``created`` time (each response has its own)."""
    if data == "[DONE]":
        return data
    body = json.loads(data)
    body.pop("created", None)
    return body


async def post(http: httpx.AsyncClient, path: str, body: dict[str, Any],
               **headers: str) -> httpx.Response:
    return await http.post(path, json={"model": MODEL, **body},
                           headers={**auth(), **headers})


@pytest.fixture
async def http(gateway: str, gen_worker: Callable[..., Any]) -> Any:
    await gen_worker()
    async with httpx.AsyncClient(base_url=gateway.removesuffix("/v1"), timeout=60) as client:
        yield client


async def test_text_parts_answer_as_the_joined_string(http: httpx.AsyncClient) -> None:
    params = {"max_tokens": 8, "temperature": 0}
    joined = await post(http, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Tell me\nabout the queue"}], **params})
    parts = await post(http, "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Tell me"}, {"type": "text", "text": "about the queue"}]}],
        **params})
    assert joined.status_code == parts.status_code == 200, parts.text
    a, b = joined.json(), parts.json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"] == b["usage"]


async def test_x_request_id_is_the_id_and_is_echoed(http: httpx.AsyncClient) -> None:
    response = await post(http, "/v1/completions", {"prompt": "the queue", "max_tokens": 4},
                          **{"X-Request-Id": "client-42"})
    assert response.status_code == 200, response.text
    assert response.headers["X-Request-Id"] == "client-42"
    assert response.headers["X-Inferq-Request-Id"] == "client-42"
    assert response.json()["id"] == "cmpl-client-42"
    # The same id again is the same request (idempotent), not a second generation.
    again = await post(http, "/v1/completions", {"prompt": "something else", "max_tokens": 4},
                       **{"X-Request-Id": "client-42"})
    assert again.json()["choices"] == response.json()["choices"]
    bad = await post(http, "/v1/completions", {"prompt": "x"}, **{"X-Request-Id": "no spaces"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "X-Request-Id"


async def test_logprobs_in_both_shapes(http: httpx.AsyncClient) -> None:
    chat = await post(http, "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 6, "ignore_eos": True, "logprobs": True,
        "top_logprobs": 3})
    assert chat.status_code == 200, chat.text
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == chat.json()["usage"]["completion_tokens"] == 6
    for item in content:
        assert item["logprob"] <= 0 and len(item["top_logprobs"]) == 3
        # The chosen token is greedy's: the most likely one.
        assert item["logprob"] == pytest.approx(item["top_logprobs"][0]["logprob"])
        assert item["bytes"] == list(item["token"].encode())
    text = await post(http, "/v1/completions", {"prompt": "the queue", "max_tokens": 5,
                                                "ignore_eos": True, "logprobs": 2})
    logprobs = text.json()["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 5
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0
    plain = await post(http, "/v1/completions", {"prompt": "the queue", "max_tokens": 5,
                                                 "ignore_eos": True, "logprobs": None})
    assert plain.json()["choices"][0]["logprobs"] is None


async def read(http: httpx.AsyncClient, method: str, path: str, *, json_body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[httpx.Response, list[Event]]:
    async with http.stream(method, path, json=json_body,
                           headers={**auth(), **(headers or {})}) as response:
        raw = "".join([chunk async for chunk in response.aiter_text()])
    return response, parse_events(raw)


@pytest.mark.parametrize("chat", [True, False])
async def test_a_stream_resumes_from_every_event_with_no_duplicate(
        http: httpx.AsyncClient, chat: bool) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "ignore_eos": True,
                            "stream": True, "resumable": True,
                            "stream_options": {"include_usage": True}}
    body.update({"messages": CHAT} if chat else {"prompt": "the queue worker"})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    response, events = await read(http, "POST", path, json_body=body,
                                  headers={"X-Request-Id": f"resume-{chat}"})
    assert response.status_code == 200
    ids = [i for i, _ in events]
    assert None not in ids and len(set(ids)) == len(ids)
    assert events[-1][1] == "[DONE]"
    usage = json.loads(events[-2][1])["usage"]
    assert usage["completion_tokens"] == 24
    finish = json.loads(events[-3][1])["choices"][0]
    assert finish["finish_reason"] == "length"
    if chat:
        assert ids[0] == "0-0"
    query = {"model": MODEL, "format": "chat" if chat else "completion",
             "include_usage": "true"}
    url = httpx.URL(f"/v1/requests/resume-{chat}/stream", params=query)
    # From the start (no Last-Event-ID): the same events.
    _, again = await read(http, "GET", str(url))
    assert [(i, same(d)) for i, d in again] == [(i, same(d)) for i, d in events]
    # Lost after event k: the rest, exactly.
    for k, (event_id, _data) in enumerate(events):
        assert event_id is not None
        resumed, rest = await read(http, "GET", str(url), headers={"Last-Event-ID": event_id})
        assert resumed.status_code == 200
        assert [(i, same(d)) for i, d in rest] == [(i, same(d)) for i, d in events[k + 1:]], k


async def test_a_resumable_stream_keeps_running_when_its_client_goes_away(
        http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 48, "ignore_eos": True,
            "stream": True, "resumable": True}
    got: list[Event] = []
    async with http.stream("POST", "/v1/chat/completions", json=body,
                           headers={**auth(), "X-Request-Id": "leaves-early"}) as response:
        buffer = ""
        async for chunk in response.aiter_text():
            buffer += chunk
            if buffer.count("\n\n") >= 2:
                break  # the client goes away after two events
        got = parse_events(buffer[:buffer.rindex("\n\n")])
    last = got[-1][0]
    assert last is not None
    url = httpx.URL("/v1/requests/leaves-early/stream", params={"model": MODEL})
    _, rest = await read(http, "GET", str(url), headers={"Last-Event-ID": last})
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or ""
                   for _, d in got + rest if d.startswith("{") and json.loads(d)["choices"])
    assert rest[-1][1] == "[DONE]"
    assert json.loads(rest[-2][1])["choices"][0]["finish_reason"] == "length"
    done = await http.get("/v1/requests/leaves-early",
                          params={"model": MODEL, "task": "generate"}, headers=auth())
    assert done.json()["result"]["output"]["text"] == text


async def test_ids_only_for_clients_that_can_use_them(http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "the queue", "max_tokens": 4, "stream": True}
    _, plain = await read(http, "POST", "/v1/completions", json_body=body)
    assert all(i is None for i, _ in plain) and plain[-1][1] == "[DONE]"
    _, sse = await read(http, "POST", "/v1/completions", json_body=body,
                        headers={"Accept": "text/event-stream"})
    assert all(i is not None for i, _ in sse)


async def test_bad_resume_requests(http: httpx.AsyncClient) -> None:
    url = httpx.URL("/v1/requests/nobody/stream", params={"model": MODEL})
    missing = await http.get(str(url), headers=auth())
    assert missing.status_code == 404
    bad = await http.get(str(url), headers={**auth(), "Last-Event-ID": "yesterday"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "Last-Event-ID"
