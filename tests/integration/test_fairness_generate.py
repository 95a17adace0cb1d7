"""Fair shares through a ``generate`` worker: it claims only as many requests as it has free
slots, in the order Redis holds them, so weights 3:1 give the tenants 3:1 of the starts while
both wait."""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

import inferq
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import SET_TENANTS, tenants_call
from tests.support.generation import MODEL

KEYS = QueueKeys.for_model("generate", MODEL)


async def test_a_generate_worker_starts_requests_in_weighted_turns(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    keys, args = tenants_call(KEYS.config, weights={"a": 3, "b": 1})
    r.register_script(SET_TENANTS)(keys=keys, args=args)
    params = {"max_new_tokens": 6, "ignore_eos": True}
    await gen_worker(max_slots=2, max_preemptions=0)
    handles = await aclient.enqueue_many(  # one script call: all of a's, then all of b's
        [{"prompt": f"{t} {i}", "tenant": t, "params": params, "id": f"{t}-{i:02d}"}
         for t in "ab" for i in range(24)], model=MODEL, task="generate")
    results = [await h.result(timeout=120) for h in handles]
    order = [res.id[0] for res in sorted(results, key=lambda res: (res.started_ms or 0))]
    first = Counter(order[:24])  # while both wait
    assert abs(first["a"] - 18) <= 2 and abs(first["b"] - 6) <= 2, order
