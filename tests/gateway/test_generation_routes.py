"""``/v1/completions`` and ``/v1/chat/completions``: validation and errors over the app, then
a real uvicorn gateway and a real generate worker process serving a tiny random Llama (with a
locally trained tokenizer and chat template), driven by plain HTTP and the official ``openai``
client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr

import inferq
from inferq.gateway import GatewaySettings
from tests.conftest import WorkerProcess, wait_until
from tests.gateway.conftest import TOKEN, serve

MODEL = "tiny"
CHAT: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the queue."}]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inferq.worker.generation.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               timeout_s=120)
    with serve(settings) as url:
        yield url


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


# --- validation, errors, auth (no worker) --------------------------------------------------

@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/completions", {"max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": 8193}, "max_tokens"),
    ("/v1/chat/completions", {"temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {"top_p": 0}, "top_p"),
    ("/v1/chat/completions", {"seed": -3}, "seed"),
    ("/v1/chat/completions", {"stop": ["x"] * 9}, "stop"),
    ("/v1/chat/completions", {"stop": [""]}, "stop"),
    ("/v1/chat/completions", {"n": 2}, "n"),
    ("/v1/chat/completions", {"logit_bias": {"1": 2}}, "logit_bias"),
    ("/v1/chat/completions", {"max_tokens": 4, "max_completion_tokens": 4},
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"model": "no spaces"}, "model"),
])
def test_bad_params_are_422s_naming_the_field(api: TestClient, path: str, extra: dict[str, object],
                                              param: str) -> None:
    body: dict[str, object] = {"model": MODEL}
    body.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": CHAT})
    body.update(extra)
    response = api.post(path, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_request"
    assert param.split("[")[0] in error["message"]


def test_bad_priority_header_is_a_422(api: TestClient) -> None:
    response = api.post("/v1/completions", json={"model": MODEL, "prompt": "hi"},
                        headers={"X-Priority": "100000"})
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "X-Priority"


def test_auth_applies_and_timeouts_are_504s_that_cancel(
        make_api: Callable[..., AbstractContextManager[TestClient]], redis_url: str) -> None:
    with make_api(token=SecretStr(TOKEN)) as api:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
        assert api.post("/v1/completions", json=body).status_code == 401
        assert api.post("/v1/chat/completions",
                        json={"model": MODEL, "messages": CHAT}).status_code == 401
        # No worker: the wait times out, and the request is cancelled (nobody will read it).
        response = api.post("/v1/completions", json=body,
                            headers={**auth(), "X-Timeout-S": "0.3", "X-Priority": "3"})
        assert response.status_code == 504
        error = response.json()["error"]
        assert error["code"] == "result_timeout" and error["request_id"]
    with inferq.Client(redis_url) as client:
        handle = client.handle(error["request_id"], model=MODEL, task="generate")
        assert handle.status() is inferq.RequestState.CANCELLED


def test_stream_cancels_its_request_when_the_client_goes_away(gateway: str,
                                                              redis_url: str) -> None:
    body = {"model": MODEL, "messages": CHAT, "stream": True, "max_tokens": 8}
    with httpx.Client(timeout=30) as http, \
            http.stream("POST", f"{gateway}/chat/completions", json=body,
                        headers=auth()) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        request_id = response.headers["X-Inferq-Request-Id"]
        first = next(response.iter_lines())
        assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"] == {
            "role": "assistant", "content": ""}
    # The client is gone with no worker ever running it: the gateway cancels the request.
    with inferq.Client(redis_url) as client:
        handle = client.handle(request_id, model=MODEL, task="generate")
        wait_until(lambda: handle.status() is inferq.RequestState.CANCELLED, timeout=15,
                   what="the abandoned stream's request cancelled")


def test_stream_timeout_is_an_error_event(gateway: str, redis_url: str) -> None:
    sdk = openai.OpenAI(base_url=gateway, api_key=TOKEN, max_retries=0)
    stream = sdk.completions.create(model=MODEL, prompt="hi", max_tokens=4, stream=True,
                                    extra_headers={"X-Timeout-S": "0.5"})
    with pytest.raises(openai.APIError) as failed:
        list(stream)
    assert "result_timeout" in str(failed.value.body) or "within" in failed.value.message


# --- a real generate worker ----------------------------------------------------------------

@pytest.mark.e2e
def test_generation_through_the_gateway(gateway: str, tiny_path: Path,
                                        start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--task", "generate", "--model", f"{MODEL}={tiny_path}",
                          "--device", "cpu")
    sdk = openai.OpenAI(base_url=gateway, api_key=TOKEN, max_retries=0, timeout=120)
    params: dict[str, int] = {"max_tokens": 12, "temperature": 0, "seed": 7}

    # Non-streamed chat (the first one waits out the model load).
    chat = sdk.chat.completions.create(model=MODEL, messages=CHAT,
                                       max_tokens=12, temperature=0, seed=7)
    assert chat.object == "chat.completion" and chat.model == MODEL, worker.log[-3000:]
    assert chat.id.startswith("chatcmpl-")
    choice = chat.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert chat.usage is not None
    assert chat.usage.prompt_tokens > 0 and 1 <= chat.usage.completion_tokens <= 12
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

    # Streamed, greedy: the same text, role first, finish reason last, usage on request.
    chunks = list(sdk.chat.completions.create(
        model=MODEL, messages=CHAT, stream=True,
        stream_options={"include_usage": True}, max_tokens=12, temperature=0, seed=7))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == choice.message.content
    assert len(with_choices) >= 3  # role, at least one content piece, finish
    assert [c.choices[0].finish_reason for c in with_choices][-1] == choice.finish_reason
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == chat.usage

    # Text completions: the same params, plain HTTP with headers; and streamed.
    response = httpx.post(f"{gateway}/completions", timeout=120,
                          headers={**auth(), "X-Priority": "5", "X-Deadline-S": "60"},
                          json={"model": MODEL, "prompt": "The queue", "stop": "\n",
                                "user": "me", **params})
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["object"] == "text_completion"
    assert completion["id"] == f"cmpl-{response.headers['X-Inferq-Request-Id']}"
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert "\n" not in completion["choices"][0]["text"]
    usage = completion["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    streamed = list(sdk.completions.create(model=MODEL, prompt="The queue", stop="\n",
                                           stream=True, max_tokens=12, temperature=0, seed=7))
    assert "".join(c.choices[0].text for c in streamed) == completion["choices"][0]["text"]
    assert streamed[-1].choices[0].finish_reason == completion["choices"][0]["finish_reason"]
