"""Property: the pending order a real server builds from random tenants, weights, priorities
and costs (the ``enqueue`` script) is the reference model's (``inferq.protocol.fair``), and
so is the order the ``claim`` script takes requests in, and so are the tenants' clocks after
completions that used fewer tokens than charged (early stops give back: ``complete``).

Each example is a program of steps against one empty queue: enqueue calls (1-6 requests each,
one script call: tenants from a small pool, none included, weights 1-5, priorities from a few
bands, costs mostly small, sometimes huge so that the clamp at the top of a band and the reset
of an idle band's clock are exercised), claims of 1-5 requests, and completions of the oldest
1-5 claimed requests, each reporting none, one, some, all but one, all or more than all of the
tokens it was charged (split into prompt and completion tokens). After every step the whole
pending set (ids and scores) and every tenant's clock in the fair hash must equal the model's,
and every claim must return the model's ids in the model's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inferq.protocol import ops, scores
from inferq.protocol.codec import Result, Status, build_request, encode_request, encode_result
from inferq.protocol.cost import MAX_COST
from inferq.protocol.fair import Arrival, FairShard
from inferq.protocol.keys import QueueKeys
from tests.support.property import InputCounter, examples

KEYS = QueueKeys.for_model("embed", "fair")
inputs = InputCounter("fair order = reference model")


@dataclass(frozen=True)
class Claim:
    count: int


@dataclass(frozen=True)
class Complete:
    #: One per completed request: how much of its charge it used.
    used: list[str]


def tokens_used(how: str, charged: int) -> int:
    return {"none": 0, "one": 1, "half": charged // 2, "almost": charged - 1, "all": charged,
            "over": charged + 5}[how]


costs = st.one_of(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40),
                  st.sampled_from([MAX_COST, MAX_COST // 3, 1 << 28]))
arrivals = st.builds(
    lambda priority, tenant, weight, cost: (priority, tenant, weight, cost),
    st.sampled_from([0, 0, 0, 5, -3]), st.sampled_from(["", "a", "b", "c", "team-d"]),
    st.integers(1, 5), costs)
used = st.sampled_from(["none", "one", "half", "almost", "all", "over"])
steps = st.lists(st.one_of(st.lists(arrivals, min_size=1, max_size=6),
                           st.builds(Claim, st.integers(1, 5)),
                           st.builds(Complete, st.lists(used, min_size=1, max_size=5))),
                 min_size=1, max_size=25)


def enqueue(r: redis.Redis, script: object, rows: list[Arrival]) -> None:
    items = []
    for a in rows:
        payload = build_request("x", id=a.id, task="embed", model="fair", priority=a.priority,
                                tenant=a.tenant or None)
        items.append(ops.EnqueueItem(a.id, scores.band(a.priority), encode_request(payload),
                                     None, 3, tenant=a.tenant, weight=a.weight, cost=a.cost))
    keys, args = ops.enqueue_call(KEYS, items)
    reply = ops.parse_enqueue(script(keys=keys, args=args))  # type: ignore[operator]
    assert reply.outcomes == ["queued"] * len(rows)


def complete(r: redis.Redis, script: object, done: list[tuple[ops.Claimed, int]]) -> None:
    items = []
    for c, tokens in done:
        body = encode_result(Result(id=c.id, status=Status.OK, output="x", attempts=c.attempt))
        items.append(ops.Completion(c, "ok", body, prompt_tokens=tokens // 3,
                                    completion_tokens=tokens - tokens // 3))
    keys, args = ops.complete_call(KEYS, 60_000, 100, items)
    assert all(ops.parse_complete(script(keys=keys, args=args)))  # type: ignore[operator]


def stored_clocks(r: redis.Redis) -> dict[str, tuple[int, float, float]]:
    """The tenants' clocks: '<epoch> <last>', or '<epoch> <last> <highest>' once they differ."""
    out = {}
    for k, v in r.hgetall(KEYS.fair).items():
        if k.startswith(b"f:"):
            epoch, last, *high = v.decode().split(" ")
            out[k.decode()] = (int(epoch), float(last), float(high[0] if high else last))
    return out


Step = list[tuple[int, str, int, int]] | Claim | Complete


#: A backlogged tenant given back more than its lead on the band's head: its next request
#: starts at its own clock, below the head ('a' had two, one runs and stops early).
BACKLOGGED_EARLY_STOP: list[Step] = [[(0, "a", 1, 40), (0, "a", 1, 40)], Claim(1),
                                     Complete(["one"]), [(0, "a", 1, 40), (0, "b", 1, 40)],
                                     Claim(4)]


@settings(max_examples=examples(60),
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # flushdb per example
@example(program=BACKLOGGED_EARLY_STOP)
@given(program=steps)
def test_claim_order_equals_the_reference_model(r: redis.Redis, program: list[Step]) -> None:
    inputs.tried()
    r.flushdb()
    scripts = ops.register(r)
    model = FairShard()
    counter = 0
    charged: dict[str, int] = {}
    running: list[ops.Claimed] = []
    for step in program:
        if isinstance(step, Claim):
            keys, args = ops.claim_call(KEYS, "w", 60_000, step.count, 60_000)
            claimed = ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed
            assert [c.id for c in claimed] == model.claim(step.count)
            running += claimed
        elif isinstance(step, Complete):
            done = [(c, tokens_used(how, charged[c.id]))
                    for c, how in zip(running, step.used, strict=False)]
            del running[:len(done)]
            if done:
                complete(r, scripts["complete"], done)
            for c, tokens in done:
                model.complete(c.id, tokens)
        else:
            rows = []
            for priority, tenant, weight, cost in step:
                counter += 1
                rows.append(Arrival(f"r{counter:04d}", priority, tenant, weight, cost))
                charged[rows[-1].id] = cost
            enqueue(r, scripts["enqueue"], rows)
            model.enqueue(rows)
        stored = {k.decode(): int(v) for k, v in r.zrange(KEYS.pending, 0, -1, withscores=True)}
        assert stored == model.pending
        assert all(s < 2**53 for s in stored.values())
        assert stored_clocks(r) == model.clocks
    keys, args = ops.claim_call(KEYS, "w", 60_000, 1000, 60_000)
    rest = ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed
    assert [c.id for c in rest] == model.claim(1000)
