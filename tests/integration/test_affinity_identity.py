"""Every generate request is stored with its prefix identity (``inferq.protocol.prefix``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

import inferq
from inferq.protocol import ops, prefix
from inferq.protocol.fields import Field
from inferq.protocol.generation import ChatMessage
from inferq.protocol.keys import QueueKeys
from inferq.protocol.scripts import ALL
from tests.support.processes import wait_until

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")
KEYS = QueueKeys.for_model("generate", "m")
SYSTEM = "Follow the house style. " * 30


def stored(r: redis.Redis, request_id: str) -> tuple[str | None, str | None]:
    session, chain = r.hmget(KEYS.request(request_id), Field.SESSION, Field.PREFIXES)
    return (None if session is None else session.decode(),
            None if chain is None else chain.decode())


def test_enqueue_stores_the_chain_and_the_session(client: inferq.Client,
                                                  r: redis.Redis) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    h = client.enqueue(model="m", task="generate", messages=messages, session="conv-7",
                       tenant="acme")
    session, chain = stored(r, h.id)
    assert session == prefix.session_key("acme", "conv-7")
    assert chain is not None and chain.split() == prefix.chat_chain(
        [ChatMessage(**m) for m in messages])
    plain = client.enqueue(SYSTEM + "question", model="m", task="generate")
    assert stored(r, plain.id) == (None, " ".join(prefix.prompt_chain(SYSTEM + "question")))


def test_enqueue_many_prompts_each_get_their_own_chain(client: inferq.Client,
                                                       r: redis.Redis) -> None:
    prompts = [SYSTEM + "one", SYSTEM + "two", "short"]
    handles = client.enqueue_many(prompts, model="m", task="generate", session="s")
    for p, h in zip(prompts, handles, strict=True):
        assert stored(r, h.id) == (prefix.session_key(None, "s"),
                                   " ".join(prefix.prompt_chain(p)))
    items = client.enqueue_many([{"prompt": "a", "session": "x"}, {"prompt": "b"}],
                                model="m", task="generate")
    assert stored(r, items[0].id)[0] == prefix.session_key(None, "x")
    assert stored(r, items[1].id)[0] is None


def test_other_tasks_carry_no_identity(client: inferq.Client, r: redis.Redis) -> None:
    h = client.enqueue("text", model="m", task="embed", session="conv")
    keys = QueueKeys.for_model("embed", "m")
    assert r.hmget(keys.request(h.id), Field.SESSION, Field.PREFIXES) == [None, None]


@pytest.mark.parametrize("session", ["", " bad", "a" * 129, "x/y"])
def test_a_bad_session_fails_alone_with_a_typed_error(client: inferq.Client,
                                                      session: str) -> None:
    with pytest.raises(inferq.ValidationError):
        client.enqueue("p", model="m", task="generate", session=session)


@pytest.mark.parametrize(("session", "chain"), [
    ("zz", ""), ("", "abc"), ("", "0123456789abcdef 0123"),
    ("", " ".join(["0123456789abcdef"] * (prefix.MAX_CHAIN + 1)))])
def test_the_script_refuses_a_malformed_identity(r: redis.Redis, session: str,
                                                 chain: str) -> None:
    item = ops.EnqueueItem("r1", 0, b"p", None, 3, session=session, prefixes=chain)
    keys, args = ops.enqueue_call(KEYS, [item])
    with pytest.raises(redis.ResponseError, match="bad arguments"):
        r.eval(ALL["enqueue"], len(keys), *keys, *args)
    assert not r.exists(KEYS.request("r1"))


def gateway_session(make_api: Callable[..., AbstractContextManager[TestClient]],
                    r: redis.Redis, headers: dict[str, str], user: str | None,
                    **settings: Any) -> str | None:
    """The session identity the gateway stored for a chat call (which nobody serves: it
    times out after the test read its hash)."""
    request_id = uuid.uuid4().hex
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if user is not None:
        body["user"] = user
    with make_api(**settings) as api, ThreadPoolExecutor(1) as pool:
        call = pool.submit(api.post, "/v1/chat/completions", json=body,
                           headers={"X-Request-Id": request_id, "X-Timeout-S": "1", **headers})
        wait_until(lambda: r.exists(KEYS.request(request_id)) == 1, what="the queued request")
        session = r.hget(KEYS.request(request_id), Field.SESSION)
        assert call.result().status_code == 504
    return None if session is None else session.decode()


def test_the_gateway_takes_the_session_from_the_header_or_the_user(
        make_api: Callable[..., AbstractContextManager[TestClient]], r: redis.Redis) -> None:
    assert gateway_session(make_api, r, {"X-Session-Id": "conv-1"}, "bob") == \
        prefix.session_key(None, "conv-1")
    assert gateway_session(make_api, r, {}, "bob") is None
    assert gateway_session(make_api, r, {}, "bob", session_from_user=True) == \
        prefix.session_key(None, prefix.user_session("bob"))
    with make_api() as api:
        response = api.post("/v1/chat/completions", headers={"X-Session-Id": "no spaces"},
                            json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert response.status_code == 422
        assert response.json()["error"]["param"] == "X-Session-Id"
