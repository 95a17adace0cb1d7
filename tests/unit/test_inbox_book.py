"""The reply inbox's rules without a server or a thread: ``InboxBook`` and its listen plan,
driven by hand (each step the plan yields is answered, or failed, by the test)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from inferq.plans import Direct, Sleep
from inferq.producer import inbox
from inferq.producer.inbox import InboxBook
from inferq.protocol.keys import QueueKeys

KEYS = QueueKeys.for_model("embed", "m")


class Got(list[bytes]):
    """A waiter that keeps every result set (a future keeps the first)."""

    def done(self) -> bool:
        return False

    def set_result(self, result: bytes, /) -> None:
        self.append(result)


class Recorder:
    """Stands in for a client: a command applied to it returns (name, args)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: (name, args)


def said(command: Any) -> tuple[str, tuple[Any, ...]]:
    out: tuple[str, tuple[Any, ...]] = command(Recorder())
    return out


def popped(*entries: bytes) -> list[Any]:
    return [b"key", list(entries)]


def test_a_result_popped_before_its_waiter_is_kept_for_it() -> None:
    book = InboxBook(KEYS, "c")
    assert book.popped(popped(b"a body-a")) == []
    kept, start, arrived = book.enter("a", Got())
    assert (kept, start, arrived) == (b"body-a", False, False)
    assert book.enter("a", Got())[0] is None  # kept once


def test_beyond_the_byte_budget_only_the_id_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox, "ARRIVED_BYTES", 10)
    book = InboxBook(KEYS, "c")
    book.popped(popped(b"a " + b"x" * 8, b"b " + b"y" * 8))
    assert book.enter("b", Got())[0] == b"y" * 8
    kept, start, arrived = book.enter("a", Got())
    assert kept is None and start and arrived  # a reads its result key


def test_waiters_get_their_results_and_bare_ids_are_read() -> None:
    book = InboxBook(KEYS, "c")
    got = Got()
    book.enter("a", got)
    book.enter("b", got)
    assert book.popped(popped(b"a body-a", b"b", b"z body-z")) == ["b"]
    assert got == [b"body-a"]
    plan = book.resolve(["b"])
    assert [said(c) for c in next(plan)] == [("lindex", (KEYS.result("b"), 0))]
    with pytest.raises(StopIteration):
        plan.send([b"body-b"])
    assert got == [b"body-a", b"body-b"]


def test_the_listener_stops_with_the_last_waiter_and_starts_with_the_next() -> None:
    book = InboxBook(KEYS, "c")
    deliver = Got()
    assert book.enter("a", deliver)[1]  # the first waiter starts a listener
    assert not book.enter("b", deliver)[1]
    book.leave("a", deliver)
    book.leave("b", deliver)
    assert not book.keep_listening()
    assert book.enter("c", deliver)[1]
    book.closed = True
    assert not book.keep_listening() and not book.enter("d", deliver)[1]


def test_listen_backs_off_on_errors_then_reads_every_waiter_again() -> None:
    book = InboxBook(KEYS, "c")
    got = Got()
    book.enter("a", got)
    plan = book.listen()
    step = next(plan)
    assert isinstance(step, Direct) and said(step.command) == ("blmpop", (1.0, 1, book.key))
    assert isinstance(plan.throw(RedisConnectionError("down")), Sleep)
    resync = plan.send(None)  # after an error: every waiter's result key is read
    assert [said(c) for c in resync] == [("lindex", (KEYS.result("a"), 0))]
    assert isinstance(plan.send([b"body-a"]), Direct) and got == [b"body-a"]
    book.leave("a", got)
    with pytest.raises(StopIteration):
        plan.send(None)  # BLMPOP timed out; no one waits: the listener ends
    assert not book.listening
