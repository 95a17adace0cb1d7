"""The official ``openai`` client against a real gateway (uvicorn on a free port) and a real
MiniLM worker process: the vectors are the ones the inferq SDK gets for the same texts."""

from __future__ import annotations

import base64
import math
import struct
import threading
import time
from collections.abc import Callable, Iterator

import openai
import pytest
import uvicorn
from pydantic import SecretStr

import inferq
from inferq.embedded import free_port
from inferq.gateway import GatewaySettings, create_app
from tests.conftest import WorkerProcess
from tests.gateway.conftest import TOKEN

pytestmark = pytest.mark.e2e

TEXTS = ["The cat sat on the mat.", "A durable queue for GPU workers.", "héllo wörld ✓"]


@pytest.fixture
def gateway_url(redis_url: str) -> Iterator[str]:
    """A real uvicorn server in a thread (uvicorn skips signal handlers off the main thread)."""
    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               timeout_s=120)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=30)


def test_openai_client_embeddings_match_the_inferq_sdk(
        gateway_url: str, redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--model", "minilm", "--device", "cpu")
    with inferq.Client(redis_url) as client:
        # The inferq SDK's own answer is the reference (and waits out the model load).
        reference = [h.result(timeout=120).output
                     for h in client.enqueue_many(TEXTS, model="minilm")]

    sdk = openai.OpenAI(base_url=gateway_url, api_key=TOKEN, max_retries=0)
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
        openai.OpenAI(base_url=gateway_url, api_key="wrong", max_retries=0).embeddings.create(
            model="minilm", input="x")
    with pytest.raises(openai.UnprocessableEntityError) as bad:
        sdk.embeddings.create(model="minilm", input="x", dimensions=64)
    assert "dimensions" in str(bad.value)
