"""Every OpenAI / vLLM request field the gateway does not implement is refused with a 400 naming
it, unless it has its no-op value, which is always accepted; chat content as text parts; the
SDK's ``messages`` take parts too. No worker: an accepted body reaches the queue lookup (a 404
``model_not_found`` with ``require_served_model``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import inferq
from inferq.openai import fields as openai_fields
from tests.support.docs import reference
from tests.support.gateway import CHAT
from tests.support.generation import MODEL

ROUTES = {"/v1/chat/completions": openai_fields.CHAT,
          "/v1/completions": openai_fields.COMPLETION,
          "/v1/embeddings": openai_fields.EMBEDDINGS}
#: A value that is not a no-op, per field (anything not listed: a string).
NOT_NOOP: dict[str, Any] = {
    "n": 2, "best_of": 3, "use_beam_search": True, "length_penalty": 0.5,
    "frequency_penalty": 0.5, "presence_penalty": -1.0, "logit_bias": {"5": 10},
    "allowed_token_ids": [1, 2], "bad_words": ["x"], "echo": True, "suffix": "end",
    "response_format": {"type": "json_object"}, "include_stop_str_in_output": True,
    "skip_special_tokens": False, "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 32, "prompt_logprobs": 2, "return_tokens_as_token_ids": True,
    "store": True, "service_tier": "flex", "tools": [{"type": "function", "function": {
        "name": "f"}}], "tool_choice": "required", "parallel_tool_calls": "yes",
    "functions": [{"name": "f"}], "function_call": {"name": "f"}, "modalities": ["audio"],
    "chat_template_kwargs": {"x": 1}, "add_generation_prompt": False,
    "continue_final_message": True, "dimensions": 64, "metadata": {"k": "v"},
}


def body_for(path: str) -> dict[str, Any]:
    if path == "/v1/embeddings":
        return {"model": MODEL, "input": "hi"}
    if path == "/v1/completions":
        return {"model": MODEL, "prompt": "hi"}
    return {"model": MODEL, "messages": CHAT}


@pytest.fixture(scope="module")
def served(redis_url_module: str) -> Iterator[TestClient]:
    from pydantic import SecretStr

    from inferq.gateway import GatewaySettings, create_app

    settings = GatewaySettings(redis_url=SecretStr(redis_url_module), token=None,
                               require_served_model=True, allowed_hosts="testserver")
    with TestClient(create_app(settings)) as api:
        yield api


CASES = [(path, name) for path, table in ROUTES.items() for name in sorted(table)]


@pytest.mark.parametrize(("path", "name"), CASES)
def test_a_refused_field_is_400_naming_it_unless_it_is_a_noop(
        served: TestClient, path: str, name: str) -> None:
    refused = ROUTES[path][name]
    value = NOT_NOOP.get(name, "something")
    assert not refused.accepts(value)
    response = served.post(path, json={**body_for(path), name: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == name
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{name}: not supported: {refused.reason}")
    for noop in refused.noop:
        accepted = served.post(path, json={**body_for(path), name: noop})
        # Valid: it got as far as looking for a worker serving the model.
        assert accepted.status_code == 404, (name, noop, accepted.text)
        assert accepted.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_field_nobody_defines_is_still_a_422(served: TestClient, path: str) -> None:
    response = served.post(path, json={**body_for(path), "temprature": 0.5})
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "temprature"


def test_the_tables_and_the_body_models_do_not_overlap() -> None:
    from inferq.openai.schemas import (
        ChatCompletionRequest,
        CompletionRequest,
        EmbeddingsRequest,
    )

    for model, table, supported in (
            (ChatCompletionRequest, openai_fields.CHAT, openai_fields.SUPPORTED["chat"]),
            (CompletionRequest, openai_fields.COMPLETION, openai_fields.SUPPORTED["completion"]),
            (EmbeddingsRequest, openai_fields.EMBEDDINGS, openai_fields.SUPPORTED["embeddings"])):
        fields = set(model.model_fields)
        assert not fields & set(table), model
        assert set(supported) <= fields, model  # the reference page's "Implemented" is real


@pytest.mark.parametrize(("extra", "param"), [
    ({"stream": True, "logprobs": True}, "logprobs"),
    ({"stream_options": {"include_usage": True, "continuous_usage_stats": True},
      "stream": True}, "stream_options.continuous_usage_stats"),
])
def test_other_refusals_are_400s(served: TestClient, extra: dict[str, Any], param: str) -> None:
    response = served.post("/v1/chat/completions", json={**body_for("/v1/chat"), **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file", "refusal"])
def test_a_non_text_content_part_is_400_naming_its_type(served: TestClient, kind: str) -> None:
    content = [{"type": "text", "text": "what is this?"}, {"type": kind, kind: {"url": "x"}}]
    response = served.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": content}]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter"
    assert error["param"] == "messages[0].content"
    assert f"content part type {kind!r} is not supported" in error["message"]


def test_text_parts_are_accepted(served: TestClient) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    response = served.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": parts}]})
    assert response.status_code == 404  # valid: no worker serves the model


@pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")
def test_the_sdk_takes_text_parts_and_refuses_others(client: inferq.Client) -> None:
    handle = client.enqueue(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}],
        model=MODEL, task="generate")
    info = handle.info()
    assert info.state is inferq.RequestState.PENDING
    with pytest.raises(inferq.ValidationError, match="'image_url' is not supported"):
        client.enqueue(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}], model=MODEL, task="generate")
    handle.cancel()


def test_parts_join_with_newlines() -> None:
    from inferq.protocol.generation import ChatMessage

    message = ChatMessage.model_validate({"role": "user", "content": [
        {"type": "text", "text": "one"}, {"type": "input_text", "text": "two"}]})
    assert message.content == "one\ntwo"
    assert ChatMessage(role="user", content="plain").content == "plain"


@pytest.fixture(scope="module")
def redis_url_module(server: Any) -> str:
    url: str = server.url
    return url



def test_the_reference_page_is_the_gateways() -> None:
    """The generated reference page (docs/hooks/reference.py, "OpenAI fields") lists, per route,
    exactly the fields its body model implements and every refusal with its accepted no-op
    values and reason."""
    import json

    from inferq.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingsRequest

    page = reference().openai_page()
    sections = dict(re.findall(r"\n## `(/v1/[a-z/]+)`\n\n(.*?)(?=\n## |\Z)", page, re.S))
    inferq_own = {"priority", "deadline_s", "resumable"}  # inferq's fields, not OpenAI's
    for path, model, refused in (
            ("/v1/chat/completions", ChatCompletionRequest, openai_fields.CHAT),
            ("/v1/completions", CompletionRequest, openai_fields.COMPLETION),
            ("/v1/embeddings", EmbeddingsRequest, openai_fields.EMBEDDINGS)):
        section = sections.pop(path)
        implemented = re.search(r"^Implemented: (.*)\.$", section, re.M)
        assert implemented is not None, path
        listed = {name.strip("`") for name in implemented.group(1).split(", ")}
        assert listed == set(model.model_fields) - inferq_own, path
        rows = {cells[0].strip("` "): (cells[1].strip(), cells[2].strip())
                for cells in (line.strip("|").split(" | ") for line in section.splitlines()
                              if line.startswith("| `"))}
        assert rows == {name: (", ".join(f"`{json.dumps(v)}`" for v in rule.noop), rule.reason)
                        for name, rule in refused.items()}, path
    assert not sections, sections


def test_vllms_sampling_fields_map_onto_the_generate_params() -> None:
    from inferq.openai.schemas import ChatCompletionRequest, CompletionRequest

    text = CompletionRequest(model=MODEL, prompt="x", top_k=-1, min_p=0.1,
                             repetition_penalty=1.1, min_tokens=2, stop_token_ids=[5],
                             ignore_eos=True, logprobs=3, max_completion_tokens=9)
    assert text.params() == {"top_k": 0, "min_p": 0.1, "repetition_penalty": 1.1,
                             "min_tokens": 2, "stop_token_ids": [5], "ignore_eos": True,
                             "logprobs": True, "top_logprobs": 3, "max_new_tokens": 9}
    chat = ChatCompletionRequest.model_validate({"model": MODEL, "messages": CHAT,
                                                 "logprobs": True, "n": 1,
                                                 "repetition_penalty": 1.0})
    assert chat.params() == {"logprobs": True, "top_logprobs": 0, "repetition_penalty": 1.0}
