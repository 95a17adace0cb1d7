"""``/v1/completions`` and ``/v1/chat/completions`` with no worker: validation, auth and
timeouts over the app, and streams through a real uvicorn gateway."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

import inferq
from tests.support.gateway import CHAT, TOKEN, auth
from tests.support.generation import MODEL
from tests.support.processes import wait_until


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/completions", {"max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": 8193}, "max_tokens"),
    ("/v1/chat/completions", {"temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {"top_p": 0}, "top_p"),
    ("/v1/chat/completions", {"seed": -3}, "seed"),
    ("/v1/chat/completions", {"stop": ["x"] * 9}, "stop"),
    ("/v1/chat/completions", {"stop": [""]}, "stop"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/chat/completions", {"min_p": 2}, "min_p"),
    ("/v1/chat/completions", {"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": 5}]}]}, "messages[0].content"),
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
        # No worker: no event yet (the role chunk comes with the first token).
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
