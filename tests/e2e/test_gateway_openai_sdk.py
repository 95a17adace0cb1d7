"""The official ``openai`` client against a real gateway (uvicorn on a free port) and real
worker processes: MiniLM embeddings are the vectors the inferq SDK gets for the same texts, and
a generate worker on the tiny random Llama answers chat and text completions, streamed or not
(plain HTTP too)."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

import inferq
from tests.support.gateway import CHAT, TOKEN, auth
from tests.support.generation import MODEL
from tests.support.processes import WorkerProcess

TEXTS = ["The cat sat on the mat.", "A durable queue for GPU workers.", "héllo wörld ✓"]


def test_openai_client_embeddings_match_the_inferq_sdk(
        gateway: str, redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--model", "minilm", "--device", "cpu")
    with inferq.Client(redis_url) as client:
        # The inferq SDK's own answer is the reference (and waits out the model load).
        reference = [h.result(timeout=120).output
                     for h in client.enqueue_many(TEXTS, model="minilm")]

    sdk = openai.OpenAI(base_url=gateway, api_key=TOKEN, max_retries=0)
    # The SDK asks for base64 unless told otherwise and decodes it: both paths are checked.
    default = sdk.embeddings.create(model="minilm", input=TEXTS)
    as_float = sdk.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    single = sdk.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="float",
                                   extra_headers={"X-Priority": "5"})

    for response in (default, as_float):
        assert response.object == "list" and response.model == "minilm"
        assert [d.index for d in response.data] == [0, 1, 2]
        assert response.usage.prompt_tokens == response.usage.total_tokens > 0
        for item, ref in zip(response.data, reference, strict=True):
            vector = item.embedding
            assert len(vector) == 384
            assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-5)
            # Equal up to float32 rounding (base64) and batch composition (padding).
            assert max(abs(a - b) for a, b in zip(vector, ref, strict=True)) < 1e-5
    assert len(single.data) == 1
    assert max(abs(a - b) for a, b in zip(single.data[0].embedding, reference[0],
                                          strict=True)) < 1e-5
    assert single.data[0].embedding != default.data[1].embedding

    # On the wire, base64 is little-endian float32, as OpenAI sends it.
    raw = sdk.embeddings.with_raw_response.create(model="minilm", input=TEXTS[:1],
                                                  encoding_format="base64")
    wire = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(wire, str)
    decoded = struct.unpack("<384f", base64.b64decode(wire))
    assert max(abs(a - b) for a, b in zip(decoded, reference[0], strict=True)) < 1e-5
    assert raw.headers["X-Inferq-Usage"] == "estimated"

    # Errors reach the SDK as its typed exceptions.
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway, api_key="wrong", max_retries=0).embeddings.create(
            model="minilm", input="x")
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.embeddings.create(model="minilm", input="x", dimensions=64)
    assert "dimensions" in str(bad.value)


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
