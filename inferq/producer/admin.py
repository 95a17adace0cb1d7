"""The operator's side of the SDK: ``client.dead_letters(model=, task=)`` lists, shows,
requeues and purges a queue's dead letters (plans of ``inferq.deadletters``, run by the
sync or the async driver), and ``client.lookup(id)`` finds one request in any known queue
(``inferq.lookup``)."""

from __future__ import annotations

import builtins
from typing import Any

from inferq import deadletters, plans
from inferq.connection import ConnectionSettings, wrap_connection_errors
from inferq.deadletters import ActionReport, DeadLetter, DeadLetterFilter, DeadLetterReport
from inferq.protocol.keys import QueueKeys


def _filter(ids: tuple[str, ...] | list[str] | None, error_code: str | None,
            older_than_s: float | None, limit: int | None) -> DeadLetterFilter:
    return DeadLetterFilter(tuple(ids or ()), error_code, older_than_s, limit)


class DeadLetters:
    """A queue's dead letters, through a sync ``Client``. Filters: ``ids``, ``error_code``,
    ``older_than_s`` (dead for longer, Redis clock) and ``limit`` (newest first)."""

    def __init__(self, redis: Any, scripts: dict[str, Any], connection: ConnectionSettings,
                 keys: QueueKeys) -> None:
        self._redis, self._scripts, self._connection, self.keys = (
            redis, scripts, connection, keys)

    def _run(self, plan: plans.Plan[Any]) -> Any:
        with wrap_connection_errors(self._connection):
            return plans.run(self._redis, plan)

    def list(self, *, ids: builtins.list[str] | None = None, error_code: str | None = None,
             older_than_s: float | None = None, limit: int | None = 100) -> DeadLetterReport:
        flt = _filter(ids, error_code, older_than_s, limit)
        report: DeadLetterReport = self._run(deadletters.report(self.keys, flt))
        return report

    def show(self, request_id: str) -> DeadLetter | None:
        letters: list[DeadLetter] = self._run(
            deadletters.select(self.keys, deadletters.ids_filter([request_id])))
        return letters[0] if letters else None

    def requeue(self, *, ids: builtins.list[str] | None = None, error_code: str | None = None,
                older_than_s: float | None = None, limit: int | None = None) -> ActionReport:
        flt = _filter(ids, error_code, older_than_s, limit)
        result: ActionReport = self._run(deadletters.requeue(self.keys, flt, self._scripts))
        return result

    def purge(self, *, ids: builtins.list[str] | None = None, error_code: str | None = None,
              older_than_s: float | None = None, limit: int | None = None) -> ActionReport:
        flt = _filter(ids, error_code, older_than_s, limit)
        result: ActionReport = self._run(deadletters.purge(self.keys, flt, self._scripts))
        return result


class AsyncDeadLetters:
    """``DeadLetters`` through an ``AsyncClient`` (the gateway's admin routes)."""

    def __init__(self, redis: Any, scripts: dict[str, Any], connection: ConnectionSettings,
                 keys: QueueKeys) -> None:
        self._redis, self._scripts, self._connection, self.keys = (
            redis, scripts, connection, keys)

    async def _run(self, plan: plans.Plan[Any]) -> Any:
        with wrap_connection_errors(self._connection):
            return await plans.run_async(self._redis, plan)

    async def list(self, *, ids: builtins.list[str] | None = None, error_code: str | None = None,
                   older_than_s: float | None = None,
                   limit: int | None = 100) -> DeadLetterReport:
        flt = _filter(ids, error_code, older_than_s, limit)
        report: DeadLetterReport = await self._run(deadletters.report(self.keys, flt))
        return report

    async def show(self, request_id: str) -> DeadLetter | None:
        letters: list[DeadLetter] = await self._run(
            deadletters.select(self.keys, deadletters.ids_filter([request_id])))
        return letters[0] if letters else None

    async def requeue(self, *, ids: builtins.list[str] | None = None, error_code: str | None = None,
                      older_than_s: float | None = None,
                      limit: int | None = None) -> ActionReport:
        flt = _filter(ids, error_code, older_than_s, limit)
        result: ActionReport = await self._run(
            deadletters.requeue(self.keys, flt, self._scripts))
        return result

    async def purge(self, *, ids: builtins.list[str] | None = None, error_code: str | None = None,
                    older_than_s: float | None = None,
                    limit: int | None = None) -> ActionReport:
        flt = _filter(ids, error_code, older_than_s, limit)
        result: ActionReport = await self._run(deadletters.purge(self.keys, flt, self._scripts))
        return result
