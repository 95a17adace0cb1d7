"""Cache affinity through a real generate worker (tiny model, step loop on a thread): it
publishes what its prefix cache holds, clears it when it stops, and its claims prefer it."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import inferq
from inferq.cli.stats import format_generation
from inferq.protocol import prefix
from inferq.protocol.codec import build_request
from inferq.protocol.keys import QueueKeys
from inferq.stats import _window
from tests.integration.test_generate_worker import until
from tests.support.generation import MODEL

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")
KEYS = QueueKeys.for_model("generate", MODEL)
SYSTEM_A = "the queue worker asks what is the capital of France " * 4
SYSTEM_B = "a token stream and the worker and a queue " * 4
PARAMS = {"max_new_tokens": 4, "ignore_eos": True}


def chat(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def identities(messages: list[dict[str, str]]) -> set[bytes]:
    payload = build_request("", id="x", task="generate", model=MODEL, messages=messages)
    return {i.encode() for i in prefix.identities_of(payload)}


async def test_a_worker_publishes_what_its_cache_holds_and_clears_it(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    worker = await gen_worker()
    messages = chat(SYSTEM_A, "what is it")
    handle = await aclient.enqueue(model=MODEL, task="generate", messages=messages,
                                   params=PARAMS)
    assert (await handle.result(timeout=30)).ok
    key = KEYS.held(worker.config.worker_id)
    await until(lambda: r.smembers(key) == identities(messages), what="the held set")
    assert 0 < r.pttl(key) <= 3 * max(worker.config.lease_ms, 1000)
    worker.request_stop()
    await until(lambda: not r.exists(key), what="the held set deleted on stop")


@pytest.mark.parametrize("affinity", ["prefix", "off"])
async def test_a_worker_claims_what_it_holds_first(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis, affinity: str) -> None:
    r.hset(KEYS.config, mapping={"affinity": affinity, "affinity_max_wait_ms": 60_000})
    worker = await gen_worker(max_slots=1)  # one request at a time: claims of one
    first = await aclient.enqueue(model=MODEL, task="generate",
                                  messages=chat(SYSTEM_A, "first"), params=PARAMS)
    assert (await first.result(timeout=30)).ok
    await until(lambda: r.exists(KEYS.held(worker.config.worker_id)) == 1,
                what="the held set")
    # one enqueue call: both wait before the worker's next claim
    other, same = await aclient.enqueue_many(
        [{"prompt": "", "messages": chat(SYSTEM_B, "other")},
         {"prompt": "", "messages": chat(SYSTEM_A, "second")}],
        model=MODEL, task="generate", params=PARAMS)
    other_result, same_result = await other.result(timeout=30), await same.result(timeout=30)
    assert other_result.started_ms is not None and same_result.started_ms is not None
    if affinity == "off":  # the head goes first
        assert other_result.started_ms < same_result.started_ms
        return
    # the request whose system prompt the worker holds goes first
    assert same_result.started_ms < other_result.started_ms
    # Visible: Prometheus, and inferq stats (the worker's window hash)
    sample = worker.metrics.registry.get_sample_value
    labels = {"queue": KEYS.queue}
    assert sample("inferq_affinity_claimed_total", labels) == 1
    assert sample("inferq_claimed_total", labels) == 3
    window = KEYS.window(worker.config.worker_id)
    await until(lambda: r.hget(window, "affinity_claimed") == b"1"
                and r.hget(window, "claimed") == b"3", what="the published stats")
    fields = _window(r.hgetall(window))
    assert 0 < fields["prefix_reused_tokens"] < fields["prefix_prompt_tokens"]
    assert sample("inferq_prefix_cache_reused_tokens", labels) == fields["prefix_reused_tokens"]
    line = format_generation(worker.config.worker_id, fields)
    rate = fields["prefix_reused_tokens"] / fields["prefix_prompt_tokens"]
    assert f"prefix cache hit rate {rate:.0%}" in line and "affinity claims 1/3" in line
