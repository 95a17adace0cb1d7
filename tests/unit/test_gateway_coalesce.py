"""The gateway's coalescer: concurrent callers in one event-loop turn share one
``enqueue_many``, and each caller still succeeds or fails alone (no Redis: a fake client)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

from inferq.errors import QueueFull, ValidationError
from inferq.gateway.coalesce import Coalescer
from inferq.producer.aio import AsyncClient


class FakeHandle:
    def __init__(self, request: Mapping[str, Any]) -> None:
        self.request = dict(request)
        self.cancelled = False

    async def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeClient:
    """Records each ``enqueue_many``; refuses prompts starting 'full', rejects 'bad'."""

    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.handles: list[FakeHandle] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def enqueue_many(self, requests: Sequence[Mapping[str, Any]]) -> list[FakeHandle]:
        self.calls.append([dict(r) for r in requests])
        await self.gate.wait()
        if any(r["prompt"] == "bad" for r in requests):
            raise ValidationError("request #0: bad prompt")
        accepted = [FakeHandle(r) for r in requests if not r["prompt"].startswith("full")]
        self.handles += accepted
        refused = [i for i, r in enumerate(requests) if r["prompt"].startswith("full")]
        if refused:
            raise QueueFull("full", depth=1, max_depth=1, accepted=list(accepted),
                            refused=refused)
        return accepted


def coalescer(**kw: Any) -> tuple[Coalescer, FakeClient]:
    fake = FakeClient()
    return Coalescer(cast(AsyncClient, fake), **kw), fake


def prompts_of(handles: Sequence[Any]) -> list[str]:
    return [h.request["prompt"] for h in handles]


async def test_callers_of_one_loop_turn_share_one_call_and_keep_their_fields() -> None:
    c, fake = coalescer()
    a, b, d = await asyncio.gather(
        c.enqueue_many(["a1", "a2"], model="m", task="embed", priority=1),
        c.enqueue_many(["b1"], model="n", task="embed", priority=5, deadline_s=2.0),
        c.enqueue_many(["d1", "d2", "d3"], model="m", task="embed", priority=0))
    assert len(fake.calls) == 1 and c.calls == 1 and c.requests == 6
    assert prompts_of(a) == ["a1", "a2"] and prompts_of(b) == ["b1"]
    assert prompts_of(d) == ["d1", "d2", "d3"]
    assert b[0].request == {"prompt": "b1", "model": "n", "task": "embed", "priority": 5,
                            "deadline_s": 2.0}
    assert a[1].request["priority"] == 1


async def test_later_turns_make_later_calls() -> None:
    c, fake = coalescer()
    await c.enqueue_many(["x"], model="m")
    await c.enqueue_many(["y"], model="m")
    assert [[r["prompt"] for r in call] for call in fake.calls] == [["x"], ["y"]]


async def test_a_large_turn_is_split_at_max_batch_between_callers() -> None:
    c, fake = coalescer(max_batch=3)
    got = await asyncio.gather(*(c.enqueue_many([f"{i}a", f"{i}b"], model="m")
                                 for i in range(4)))
    assert [len(call) for call in fake.calls] == [2, 2, 2, 2]
    assert [prompts_of(h) for h in got] == [[f"{i}a", f"{i}b"] for i in range(4)]


async def test_a_refusal_fails_only_the_caller_whose_input_was_refused() -> None:
    c, fake = coalescer()
    ok, refused, also_ok = await asyncio.gather(
        c.enqueue_many(["a"], model="m"), c.enqueue_many(["b", "full-b"], model="m"),
        c.enqueue_many(["c"], model="m"), return_exceptions=True)
    assert len(fake.calls) == 1
    assert prompts_of(cast(list[Any], ok)) == ["a"]
    assert prompts_of(cast(list[Any], also_ok)) == ["c"]
    assert isinstance(refused, QueueFull)
    assert prompts_of(refused.accepted) == ["b"]  # the route cancels it: all or nothing


async def test_a_bad_input_fails_only_its_caller() -> None:
    c, fake = coalescer()
    ok, bad = await asyncio.gather(c.enqueue_many(["a"], model="m"),
                                   c.enqueue_many(["bad"], model="m"), return_exceptions=True)
    assert prompts_of(cast(list[Any], ok)) == ["a"]
    assert isinstance(bad, ValidationError)
    assert len(fake.calls) == 3  # together, then each alone


async def test_a_caller_gone_before_the_call_returns_has_its_requests_cancelled() -> None:
    c, fake = coalescer()
    fake.gate.clear()
    gone = asyncio.create_task(c.enqueue_many(["g1", "g2"], model="m"))
    stays = asyncio.create_task(c.enqueue_many(["s"], model="m"))
    while not fake.calls:
        await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    fake.gate.set()
    assert prompts_of(await stays) == ["s"]
    for _ in range(50):  # the cancellation runs in a task of its own, a few turns later
        await asyncio.sleep(0)
    assert {h.request["prompt"]: h.cancelled for h in fake.handles} == {
        "g1": True, "g2": True, "s": False}
