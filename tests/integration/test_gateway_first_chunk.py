"""The chat stream's first, role-only chunk goes out with the generation's first token, even
when that token shows no text yet (held back, or empty: special tokens), as vLLM's server sends
it: clients such as ``vllm bench serve`` time the first token by it. Here the test plays the
worker: it writes the request's stream entries itself."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import redis

from inferq.protocol.fields import StreamField
from inferq.protocol.keys import QueueKeys
from tests.support.gateway import auth

pytestmark = pytest.mark.timeout(120)

KEYS = QueueKeys.for_model("generate", "no-worker")


async def next_data(lines: object) -> dict[str, object]:
    async for line in lines:  # type: ignore[attr-defined]
        if line.startswith("data: "):
            body: dict[str, object] = json.loads(line.removeprefix("data: "))
            return body
    raise AssertionError("the stream ended")


async def test_the_role_chunk_goes_out_with_a_first_token_that_shows_no_text(
        gateway: str, r: redis.Redis) -> None:
    async with httpx.AsyncClient(base_url=gateway.removesuffix("/v1"), timeout=60) as http:
        body = {"model": "no-worker", "stream": True, "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}]}
        async with http.stream("POST", "/v1/chat/completions", json=body,
                               headers=auth()) as response:
            assert response.status_code == 200
            request_id = response.headers["X-Inferq-Request-Id"]
            lines = response.aiter_lines()
            first = asyncio.ensure_future(next_data(lines))
            # Nothing before the first token.
            done, _ = await asyncio.wait({first}, timeout=0.5)
            assert not done
            # The first token, its text held back (an empty delta).
            r.xadd(KEYS.stream(request_id), {StreamField.ATTEMPT: "1",
                                            StreamField.TEXT: "", StreamField.TOKENS: "2"})
            chunk = await asyncio.wait_for(first, timeout=10)
            assert chunk["choices"] == [{"index": 0, "delta": {"role": "assistant",
                                                                "content": ""},
                                         "logprobs": None, "finish_reason": None}]
            # Its text, once there, comes next.
            r.xadd(KEYS.stream(request_id), {StreamField.ATTEMPT: "1",
                                            StreamField.TEXT: "Hel", StreamField.TOKENS: "7"})
            text = await asyncio.wait_for(next_data(lines), timeout=10)
            assert text["choices"][0]["delta"] == {"content": "Hel"}  # type: ignore[index]
