"""The transformers engine honours vLLM's sampling extensions request by request, in a batch
with plain requests, on a worker (each field's equality with transformers' processors:
tests/unit/test_sampling_extensions.py; ``--engine vllm``: tests/integration/
test_generate_vllm.py). What an engine cannot do fails alone: the vLLM engine's refusals are in
tests/unit/test_vllm_engine.py."""

from __future__ import annotations

from typing import Any

import pytest

import inferq
from tests.support.generation import MODEL


@pytest.mark.parametrize("params", [{"min_p": 0.1, "temperature": 0.8, "seed": 3},
                                    {"repetition_penalty": 1.2}, {"min_tokens": 3},
                                    {"logprobs": True, "top_logprobs": 2}])
async def test_the_transformers_engine_serves_sampling_extensions_beside_plain_requests(
        gen_worker: Any, aclient: inferq.AsyncClient, params: dict[str, Any]) -> None:
    await gen_worker(max_slots=4)
    for _ in range(2):  # a second time on the same worker, too
        extended = await aclient.enqueue("x", model=MODEL, task="generate",
                                         params={"max_new_tokens": 4, **params})
        plain = await aclient.enqueue_many(["a", "b"], model=MODEL, task="generate",
                                           params={"max_new_tokens": 4})
        result = await extended.result(timeout=30)
        assert result.ok and 1 <= result.usage.completion_tokens <= 4
        if "min_tokens" in params:
            assert result.usage.completion_tokens >= params["min_tokens"]
        for h in plain:
            assert (await h.result(timeout=30)).ok


async def test_a_stop_token_id_ends_the_generation_on_the_transformers_engine(
        gen_worker: Any, aclient: inferq.AsyncClient) -> None:
    await gen_worker(max_slots=4)
    free = await (await aclient.enqueue("x", model=MODEL, task="generate",
                                        params={"max_new_tokens": 6, "ignore_eos": True})
                  ).result(timeout=30)
    first = free.output["token_ids"][0]
    stopped = await (await aclient.enqueue("x", model=MODEL, task="generate",
                                           params={"max_new_tokens": 6, "ignore_eos": True,
                                                   "stop_token_ids": [first]})
                     ).result(timeout=30)
    assert stopped.finish_reason is inferq.FinishReason.STOP
    assert stopped.output["token_ids"] == [first]
