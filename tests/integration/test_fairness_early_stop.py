"""Early stops give back to the fair-share clock: two tenants of equal weight keep generations
waiting (a closed loop: each sends a new one when one of its own finishes), both ask for the
same ``max_new_tokens``, but one's generations stop early. Charged only the estimate, both
would get the same number of requests, so the early stopper a fraction of the tokens; with
the unused part given back at completion they get equal shares of the tokens actually used.

The worker side is the protocol a generate worker speaks (claim, then complete with the usage
it counted), one request at a time, so the order is exactly the one Redis decides."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import redis

import inferq
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, Usage, encode_result
from inferq.protocol.cost import estimate
from inferq.protocol.keys import QueueKeys

MODEL = "stops"
KEYS = QueueKeys.for_model("generate", MODEL)
PROMPT = "tell me more"
MAX_NEW = 60
#: Completion tokens: 'early' (and the flow without a tenant) stop after 10, 'full' runs to
#: MAX_NEW.
MADE = {"early": 10, "full": MAX_NEW, "": 10}
PROMPT_TOKENS = 3
OUTSTANDING = 4


@pytest.fixture
def gc(redis_url: str) -> Iterator[inferq.Client]:
    options = inferq.ClientOptions(settings_ttl_s=0, warn_no_worker=False)
    with inferq.Client(redis_url, options=options) as c:
        yield c


def send(client: inferq.Client, tenant: str, n: int) -> None:
    client.enqueue(PROMPT, model=MODEL, task="generate", tenant=tenant,
                   params={"max_new_tokens": MAX_NEW}, id=f"{tenant}-{n:04d}")


def run_one(r: redis.Redis, scripts: dict[str, object]) -> str:
    """Claim the head of the queue and write its result with the usage it had; its tenant."""
    keys, args = ops.claim_call(KEYS, "w", 60_000, 1, 60_000)
    [c] = ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed  # type: ignore[operator]
    tenant = c.tenant
    usage = Usage(prompt_tokens=PROMPT_TOKENS, completion_tokens=MADE[tenant])
    body = encode_result(Result(id=c.id, status=Status.OK, output="...", usage=usage))
    keys, args = ops.complete_call(KEYS, 60_000, 100, [ops.Completion(
        c, "ok", body, prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens)])
    assert ops.parse_complete(scripts["complete"](keys=keys, args=args)) == [True]  # type: ignore[operator]
    return tenant


def test_a_tenant_whose_generations_stop_early_gets_its_share_of_tokens_used(
        gc: inferq.Client, r: redis.Redis) -> None:
    charged = estimate("generate", len(PROMPT.encode()), {"max_new_tokens": MAX_NEW}, None)
    assert charged == PROMPT_TOKENS + MAX_NEW  # both are charged the same estimate
    scripts = ops.register(r)
    sent = Counter[str]()
    for tenant in ("full", "early"):
        for _ in range(OUTSTANDING):
            send(gc, tenant, sent[tenant])
            sent[tenant] += 1
    served = Counter[str]()
    for _ in range(240):
        tenant = run_one(r, scripts)
        served[tenant] += 1
        send(gc, tenant, sent[tenant])  # closed loop: one done, one more
        sent[tenant] += 1
    used = {t: served[t] * (PROMPT_TOKENS + MADE[t]) for t in ("early", "full")}
    # Equal weights, equal shares of the tokens used: within one full request's tokens for
    # each request the loop keeps outstanding (the scores already given do not move).
    assert abs(used["early"] - used["full"]) <= OUTSTANDING * charged, (served, used)
    # Charged only the estimate, each would have had about half the requests (120).
    assert served["early"] >= 4 * served["full"], served


def test_the_clock_gets_back_only_what_was_not_used_and_only_for_named_tenants(
        gc: inferq.Client, r: redis.Redis) -> None:
    charged = PROMPT_TOKENS + MAX_NEW
    gc.enqueue_many([{"prompt": PROMPT, "tenant": "early", "id": "early-0"},  # one call: both
                     {"prompt": PROMPT, "id": "none-0"}],                 # start at 0
                    model=MODEL, task="generate", params={"max_new_tokens": MAX_NEW})
    clocks = r.hgetall(KEYS.fair)
    assert clocks[b"f:100:early"] == b"0 %d" % charged
    assert clocks[b"f:100:"] == b"0 %d" % charged
    assert r.hget(KEYS.request("early-0"), "fc") == b"100 0 1 %d" % charged
    assert r.hget(KEYS.request("none-0"), "fc") is None
    scripts = ops.register(r)
    assert {run_one(r, scripts) for _ in range(2)} == {"early", ""}
    clocks = r.hgetall(KEYS.fair)
    # 'early' used 3 + 10 of its 63: 50 come back; the flow without a tenant keeps FIFO.
    assert clocks[b"f:100:early"] == b"0 %d %d" % (PROMPT_TOKENS + MADE["early"], charged)
    assert clocks[b"f:100:"] == b"0 %d" % charged
