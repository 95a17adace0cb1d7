"""The transformers engine refuses, request by request, the sampling parameters only vLLM's
sampler has (``--engine vllm`` honours them: tests/integration/test_generate_vllm.py); the
others in the same batch are served."""

from __future__ import annotations

from typing import Any

import pytest

import inferq
from tests.support.generation import MODEL


@pytest.mark.parametrize("params", [{"min_p": 0.1}, {"stop_token_ids": [5]},
                                    {"repetition_penalty": 1.2}])
async def test_the_transformers_engine_fails_vllm_only_params_alone(
        gen_worker: Any, aclient: inferq.AsyncClient, params: dict[str, Any]) -> None:
    await gen_worker(max_slots=4)
    refused = await aclient.enqueue("x", model=MODEL, task="generate",
                                    params={"max_new_tokens": 4, **params})
    served = await aclient.enqueue_many(["a", "b"], model=MODEL, task="generate",
                                        params={"max_new_tokens": 4})
    with pytest.raises(inferq.RequestFailed, match=f"params.{next(iter(params))}") as info:
        await refused.result(timeout=30)
    assert info.value.error_code == "invalid_input"
    assert "only --engine vllm" in str(info.value)
    for h in served:
        assert (await h.result(timeout=30)).ok
    # A second time, on the same worker: still refused, still alone.
    again = await aclient.enqueue("y", model=MODEL, task="generate",
                                  params={"max_new_tokens": 4, **params})
    with pytest.raises(inferq.RequestFailed):
        await again.result(timeout=30)
