"""Sans-IO plans: one description of a conversation with Redis, run by a sync or an async
driver, so no rule is written twice for ``redis.Redis`` and ``redis.asyncio.Redis``.

A plan is a generator. It yields *steps* and is sent each step's reply, until it returns what
it read. A step that fails is thrown into the plan (``generator.throw``), so a plan catches
Redis errors where its rule says so (a retry, a resync) and lets the others through. Plans
compose with ``yield from``. Steps:

* a list of commands (``call("zcard", key)`` calls ``pipeline.zcard(key)``): one pipelined
  round trip; the reply is the list of their replies, and the first error is raised;
* ``Pipeline(commands, raise_on_error=False, on=client)``: the same, errors returned in place
  (``on``: another client than the driver's, e.g. one node of a cluster);
* ``Direct(command)``: one command on the client itself, not in a pipeline (a blocking read,
  ``SCRIPT LOAD``, which a cluster client sends to every master);
* ``Do(fn)``: ``fn()``, awaited by the async driver: for a call the plan cannot name as a
  command (a cluster client's own ``execute_command``, its slot map refresh);
* ``Sleep(seconds)``: ``time.sleep`` or ``asyncio.sleep``.

``run`` drives a plan on a synchronous client, ``run_async`` on an asyncio one. The plans:
``stats`` (queue statistics), ``producer.handle`` (what a handle asks about its request),
``producer.inbox`` (the reply inbox's listener), ``cluster`` (a round of script calls, the
retry rule through a failover, durable writes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from operator import methodcaller
from typing import Any, TypeVar, cast

T = TypeVar("T")
#: One command: ``call("zcard", key)(pipe)`` is ``pipe.zcard(key)``.
Command = methodcaller
call = methodcaller


@dataclass(frozen=True, slots=True)
class Pipeline:
    commands: Sequence[Command]
    raise_on_error: bool = True
    #: The client to run on (None: the driver's).
    on: Any = None


@dataclass(frozen=True, slots=True)
class Direct:
    command: Command
    on: Any = None


@dataclass(frozen=True, slots=True)
class Do:
    fn: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Step = list[Command] | Pipeline | Direct | Do | Sleep
Plan = Generator[Step, Any, T]


def once(step: Step) -> Plan[Any]:
    """A plan of one step: its reply."""
    return (yield step)


def _pipeline(client: Any, commands: Sequence[Command]) -> Any:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        command(pipe)
    return pipe


def _sync_step(client: Any, step: Step) -> Any:
    if isinstance(step, list):
        return _pipeline(client, step).execute()
    if isinstance(step, Pipeline):
        return _pipeline(step.on or client, step.commands).execute(
            raise_on_error=step.raise_on_error)
    if isinstance(step, Direct):
        return step.command(step.on or client)
    if isinstance(step, Do):
        return step.fn()
    time.sleep(step.seconds)
    return None


async def _async_step(client: Any, step: Step) -> Any:
    if isinstance(step, list):
        return await _pipeline(client, step).execute()
    if isinstance(step, Pipeline):
        return await _pipeline(step.on or client, step.commands).execute(
            raise_on_error=step.raise_on_error)
    if isinstance(step, Direct):
        return await step.command(step.on or client)
    if isinstance(step, Do):
        return await cast("Awaitable[Any]", step.fn())
    await asyncio.sleep(step.seconds)
    return None


def run(client: Any, plan: Plan[T]) -> T:
    """Execute a plan on a synchronous client (``redis.Redis`` or a cluster client)."""
    # One loop, no driver object: every enqueue runs a plan, so its cost counts.
    send = plan.send
    try:
        step = send(None)
        while True:
            try:
                reply = _sync_step(client, step)
            except Exception as exc:  # the plan catches it, or it comes out of ``throw``
                step = plan.throw(exc)
            else:
                step = send(reply)
    except StopIteration as done:
        return cast(T, done.value)


async def run_async(client: Any, plan: Plan[T]) -> T:
    """``run`` on an asyncio client."""
    send = plan.send
    try:
        step = send(None)
        while True:
            try:
                reply = await _async_step(client, step)
            except Exception as exc:
                step = plan.throw(exc)
            else:
                step = send(reply)
    except StopIteration as done:
        return cast(T, done.value)
