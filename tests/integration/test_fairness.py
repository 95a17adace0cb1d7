"""Fair shares through the SDK against a real server: tenants on every request, weights and
quotas from the queue's settings, the claim order they give, and the counts behind the quota
after every way a request can end."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

import inferq
from inferq.errors import QueueFull, ValidationError
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, encode_result
from inferq.protocol.keys import TENANT_COUNT, QueueKeys
from inferq.protocol.settings import SET_TENANTS, tenants_call

KEYS = QueueKeys.for_model("embed", "fair")
TTL_MS = 60_000
NO_CACHE = inferq.ClientOptions(settings_ttl_s=0, warn_no_worker=False)


@pytest.fixture
def fc(redis_url: str) -> Iterator[inferq.Client]:
    with inferq.Client(redis_url, options=NO_CACHE) as c:
        yield c


def set_tenants(r: redis.Redis, **kw: object) -> None:
    keys, args = tenants_call(KEYS.config, **kw)  # type: ignore[arg-type]
    r.register_script(SET_TENANTS)(keys=keys, args=args)


def claim(r: redis.Redis, n: int, keys: QueueKeys = KEYS) -> list[ops.Claimed]:
    call_keys, args = ops.claim_call(keys, "w", 60_000, n, TTL_MS)
    return ops.parse_claim(ops.register(r)["claim"](keys=call_keys, args=args)).claimed


def complete(r: redis.Redis, claimed: list[ops.Claimed], status: Status = Status.OK) -> None:
    items = [ops.Completion(c, status.value,
                            encode_result(Result(id=c.id, status=status, output="o")))
             for c in claimed]
    call_keys, args = ops.complete_call(KEYS, TTL_MS, 100, items)
    assert all(ops.parse_complete(ops.register(r)["complete"](keys=call_keys, args=args)))


def tenant_of(request_id: str) -> str:
    return request_id.split("-")[0]


def test_without_tenants_the_order_is_priority_then_fifo(fc: inferq.Client,
                                                         r: redis.Redis) -> None:
    priorities = [(i * 7) % 3 * 5 for i in range(90)]
    for i, p in enumerate(priorities):
        fc.enqueue("x" * (1 + i % 13), model="fair", priority=p, id=f"r{i:03d}")
    expected = sorted(range(90), key=lambda i: (-priorities[i], i))
    assert [c.id for c in claim(r, 100)] == [f"r{i:03d}" for i in expected]


def test_weights_three_two_one_share_the_claims(fc: inferq.Client, r: redis.Redis) -> None:
    set_tenants(r, weights={"a": 3, "b": 2, "c": 1})
    for tenant in "abc":  # each floods 60 equal requests, one tenant after the other
        fc.enqueue_many([{"prompt": "same", "id": f"{tenant}-{i}"} for i in range(60)],
                        model="fair", tenant=tenant)
    shares = Counter(tenant_of(c.id) for c in claim(r, 60))
    # Within one request of 30/20/10: finish times are compared in whole cost units, and
    # equal ones go in arrival order (here 1-token requests: 3 of 'a' share a unit).
    assert sum(shares.values()) == 60
    assert all(abs(shares[t] - n) <= 2 for t, n in {"a": 30, "b": 20, "c": 10}.items())
    assert shares["a"] > shares["b"] > shares["c"]


def test_shares_are_by_cost_not_by_requests(fc: inferq.Client, r: redis.Redis) -> None:
    fc.enqueue_many([{"prompt": "x" * 400, "id": f"long-{i}", "tenant": "long"}
                     for i in range(40)] +
                    [{"prompt": "x" * 40, "id": f"short-{i}", "tenant": "short"}
                     for i in range(200)], model="fair")
    tokens = Counter()
    for c in claim(r, 110):
        tokens[tenant_of(c.id)] += 100 if c.id.startswith("long") else 10
    assert abs(tokens["long"] - tokens["short"]) <= 100  # one long request's cost
    assert tokens["long"] + tokens["short"] >= 1000


def test_an_idle_tenant_banks_no_credit_and_a_new_one_is_served_at_once(
        fc: inferq.Client, r: redis.Redis) -> None:
    fc.enqueue_many([f"x{i}" for i in range(100)], model="fair", tenant="busy")
    assert len(claim(r, 80)) == 80  # busy alone for a while: 'idle' accumulates nothing
    fc.enqueue_many([f"y{i}" for i in range(20)], model="fair", tenant="idle")
    order = [c.id for c in claim(r, 40)]
    owners = [r.hget(KEYS.request(i), "tn") for i in order]
    # Served at once: it starts at the band's virtual time (the head's finish time), so its
    # first finish is one cost later; the head and the equal finish that came first go
    # before it.
    assert owners.index(b"idle") <= 2
    # From then on the two alternate: 'idle' does not get its 80 requests' worth in a row.
    idle_run = max(len(run) for run in "".join(
        "i" if o == b"idle" else "." for o in owners).split("."))
    assert idle_run <= 2
    assert owners[:40].count(b"idle") == 20  # equal shares while both wait


def test_priority_dominates_tenants(fc: inferq.Client, r: redis.Redis) -> None:
    set_tenants(r, weights={"vip": 1000})
    fc.enqueue_many([f"v{i}" for i in range(5)], model="fair", tenant="vip", priority=0)
    fc.enqueue("urgent", model="fair", priority=1, id="urgent")
    assert claim(r, 1)[0].id == "urgent"


def test_a_weight_change_applies_to_new_requests_without_a_restart(
        fc: inferq.Client, r: redis.Redis) -> None:
    fc.enqueue("warm", model="fair", tenant="a")  # the client has read the settings
    claim(r, 1)
    set_tenants(r, weights={"a": 4})
    fc.enqueue_many([{"prompt": "same", "id": f"a-{i}"} for i in range(40)],
                    model="fair", tenant="a")
    fc.enqueue_many([{"prompt": "same", "id": f"b-{i}"} for i in range(40)],
                    model="fair", tenant="b")
    shares = Counter(tenant_of(c.id) for c in claim(r, 50))
    assert abs(shares["a"] - 40) <= 2 and abs(shares["b"] - 10) <= 2  # 4:1 (whole units)


def test_tenant_names_are_validated_like_queue_names(fc: inferq.Client) -> None:
    for bad in ("a b", "", "-x", "x" * 65, "a:b"):
        with pytest.raises(ValidationError) as info:
            fc.enqueue("x", model="fair", tenant=bad)
        assert info.value.field == "tenant"
    with pytest.raises(ValidationError) as info:
        fc.enqueue("x", model="fair", cost=5)  # embed estimates its cost itself
    assert info.value.field == "cost"


def test_the_tenant_quota_refuses_naming_the_tenant_and_frees_as_requests_end(
        fc: inferq.Client, r: redis.Redis) -> None:
    set_tenants(r, max_depths={"a": 3})
    handles = [fc.enqueue(f"x{i}", model="fair", tenant="a") for i in range(3)]
    with pytest.raises(QueueFull) as info:
        fc.enqueue("one more", model="fair", tenant="a")
    assert info.value.tenant == "a" and "tenant 'a'" in str(info.value)
    fc.enqueue("others still get in", model="fair", tenant="b")
    fc.enqueue("and the unnamed", model="fair")
    with pytest.raises(QueueFull) as many:
        fc.enqueue_many(["p", "q"], model="fair", tenant="a")
    assert many.value.refused == [0, 1] and many.value.tenant == "a"
    # claimed, not finished: still counted
    first = claim(r, 10)
    running = [c for c in first if r.hget(KEYS.request(c.id), "tn") == b"a"]
    others = [c for c in first if c not in running]
    with pytest.raises(QueueFull):
        fc.enqueue("still full", model="fair", tenant="a")
    complete(r, running[:1])                        # finished: one place frees
    fc.enqueue("in again", model="fair", tenant="a")
    assert handles[1].cancel()                      # cancelled (while running): frees
    complete(r, running[2:], Status.FAILED)         # failed: frees
    assert int(r.hget(KEYS.stats, TENANT_COUNT + "a") or 0) == 1  # 'in again' waits
    complete(r, claim(r, 10) + others)
    assert r.hget(KEYS.stats, TENANT_COUNT + "a") is None  # nothing left: field gone
    assert r.hget(KEYS.stats, TENANT_COUNT + "b") is None
    # an atomic batch with one request over the tenant's limit queues none of them
    set_tenants(r, max_depths={"a": 1})
    with pytest.raises(QueueFull):
        fc.enqueue_many([{"prompt": "u", "tenant": "b"}, {"prompt": "v", "tenant": "a"},
                         {"prompt": "w", "tenant": "a"}], model="fair", atomic=True)
    assert r.zcard(KEYS.pending) == 0


def test_the_quota_counts_expired_and_dead_lettered_requests_out(
        fc: inferq.Client, r: redis.Redis) -> None:
    set_tenants(r, max_depths={"a": 5})
    fc.enqueue("late", model="fair", tenant="a", deadline_s=0.001)
    fc.enqueue("dies", model="fair", tenant="a", max_attempts=1)
    time.sleep(0.01)  # the deadline passes (nothing to await: it is a time)
    claimed = claim(r, 10)  # 'late' is answered expired by the claim
    assert [c.id for c in claimed] and len(claimed) == 1
    complete(r, claimed, Status.DEAD)
    assert r.hget(KEYS.stats, TENANT_COUNT + "a") is None


def test_a_damaged_request_answered_by_the_claim_leaves_the_count(
        fc: inferq.Client, r: redis.Redis) -> None:
    set_tenants(r, max_depths={"a": 5})
    handle = fc.enqueue("x", model="fair", tenant="a")
    r.hset(KEYS.request(handle.id), "a", "not a number")  # damaged in place
    assert claim(r, 10) == []  # answered corrupt_request by the claim script
    assert handle.status() is inferq.RequestState.FAILED
    assert r.hget(KEYS.stats, TENANT_COUNT + "a") is None


def test_fair_shares_cost_three_commands_per_enqueue_call_whatever_its_size(
        fc: inferq.Client, r: redis.Redis) -> None:
    """docs/guides/fair-sharing.md: the fair hash costs one HMGET, one ZRANGEBYSCORE (the
    band's head) and one HSET per enqueue call and band, not per request; a tenant adds one
    HINCRBY."""
    fc.enqueue("warm", model="fair")  # scripts loaded, settings cached

    def calls(**kw: object) -> Counter[str]:
        r.config_resetstat()
        fc.enqueue_many([f"x{i}" for i in range(500)], model="fair", **kw)  # type: ignore[arg-type]
        stats = r.info("commandstats")
        return Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()})

    plain = calls()
    assert plain["evalsha"] == 1
    assert (plain["hmget"], plain["zrangebyscore"], plain["hset"]) == (1, 1, 501)
    tenant = calls(tenant="a")
    assert tenant["hincrby"] == plain["hincrby"] + 1
    assert tenant["hset"] == plain["hset"]


def test_a_requeued_dead_letter_counts_for_its_tenant_again(
        fc: inferq.Client, r: redis.Redis) -> None:
    handle = fc.enqueue("dies", model="fair", tenant="a", max_attempts=1)
    complete(r, claim(r, 1), Status.DEAD)
    assert r.hget(KEYS.stats, TENANT_COUNT + "a") is None
    keys, args = ops.requeue_call(KEYS, [handle.id])
    assert ops.register(r)["requeue"](keys=keys, args=args) == [b"requeued"]
    assert r.hget(KEYS.stats, TENANT_COUNT + "a") == b"1"
    assert r.hget(KEYS.request(handle.id), "tn") == b"a"
    complete(r, claim(r, 1))
    assert r.hget(KEYS.stats, TENANT_COUNT + "a") is None


def test_a_custom_task_is_charged_the_cost_its_producer_gives(
        fc: inferq.Client, r: redis.Redis) -> None:
    keys = QueueKeys.for_model("classify", "fair")
    fc.enqueue_many([{"prompt": "[1]", "id": f"x-{i}", "cost": 30} for i in range(10)],
                    model="fair", task="classify", tenant="x")
    fc.enqueue_many([{"prompt": "[1]", "id": f"y-{i}"} for i in range(60)],  # cost 1 each
                    model="fair", task="classify", tenant="y")
    shares = Counter(tenant_of(c.id) for c in claim(r, 32, keys))
    assert shares["x"] <= 2 and shares["y"] >= 30
