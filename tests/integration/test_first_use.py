"""What a new user meets first, against a real server: a model no worker serves (a warning at
once, the request kept, ``inferq stats`` listing it, the gateway's 404), a server that hangs or
is not Redis (a one-line error naming it, quickly), and the SDK's answers about a request
(``cancel()``'s outcome, ``info()``, atomic ``enqueue_many``, ``ValidationError.field``)."""

from __future__ import annotations

import time
import warnings

import pytest
import redis

import inferq
from inferq.cli.main import main
from inferq.connection import ConnectionSettings
from inferq.plans import run
from inferq.producer.presence import WorkerPresence
from inferq.protocol.keys import QueueKeys, queues_registry
from inferq.stats import read_all
from tests.support.bad_servers import http_server, silent_server
from tests.support.gateway import MakeApi

NOSUCH = QueueKeys.for_model("embed", "nosuchmodel")


def _live_worker(r: redis.Redis, keys: QueueKeys, name: str = "w1") -> None:
    seconds, micros = r.time()
    r.zadd(keys.workers, {name: seconds * 1000 + micros // 1000 + 60_000})


# ----------------------------------------------------------------- no worker serves the queue


def test_enqueue_warns_at_once_when_no_worker_serves_the_queue_and_keeps_the_request(
        redis_url: str, r: redis.Redis) -> None:
    with inferq.Client(redis_url) as client:
        with pytest.warns(inferq.NoWorkerWarning) as caught:
            handle = client.enqueue("x", model="nosuchmodel")
        assert str(caught[0].message) == (
            "no live worker serves queue embed:nosuchmodel: the request stays queued and runs "
            "once a worker starts (inferq worker --task embed --model nosuchmodel)")
        assert caught[0].filename == __file__  # it names the caller's line
        assert handle.info().state is inferq.RequestState.PENDING  # kept, not lost
        assert r.zcard(NOSUCH.pending) == 1
        # Checked once per queue every few seconds, not on every enqueue.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            client.enqueue_many(["y", "z"], model="nosuchmodel")
    (stats,) = read_all(r)
    assert stats.queue == "embed:nosuchmodel" and stats.pending == 3 and not stats.live_workers


def test_no_warning_when_a_worker_is_live(redis_url: str, r: redis.Redis) -> None:
    _live_worker(r, QueueKeys.for_model("embed", "m"))
    with inferq.Client(redis_url) as client, warnings.catch_warnings():
        warnings.simplefilter("error")
        client.enqueue("x", model="m")


def test_a_lapsed_worker_does_not_count(redis_url: str, r: redis.Redis) -> None:
    keys = QueueKeys.for_model("embed", "m")
    r.zadd(keys.workers, {"gone": 1})  # liveness deadline long past
    presence = WorkerPresence("inferq", warn=False)
    assert run(r, presence.check(presence.due([keys]))) == ["embed:m"]
    assert presence.due([keys]) == []  # checked again only after a few seconds


async def test_the_async_client_warns_too(redis_url: str) -> None:
    async with inferq.AsyncClient(redis_url) as client:
        with pytest.warns(inferq.NoWorkerWarning) as caught:
            await client.enqueue("x", model="nosuchmodel")
        assert caught[0].filename == __file__


def test_cli_enqueue_prints_the_warning_as_one_line(
        redis_url: str, r: redis.Redis, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "x", "--model", "nosuchmodel", "--no-wait",
                 "--redis-url", redis_url]) == 0
    out, err = capsys.readouterr()
    assert err == ("inferq: warning: no live worker serves queue embed:nosuchmodel: the request "
                   "stays queued and runs once a worker starts (inferq worker --task embed "
                   "--model nosuchmodel)\n")
    assert r.zcard(NOSUCH.pending) == 1  # queued all the same
    assert out.strip() == r.zrange(NOSUCH.pending, 0, 0)[0].decode()
    assert main(["stats", "--redis-url", redis_url]) == 0
    stats = capsys.readouterr().out
    assert "queue embed:nosuchmodel" in stats and "NO LIVE WORKER: 1 request(s) wait" in stats


def test_stats_json_gives_numbers_as_numbers(
        redis_url: str, r: redis.Redis, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    keys = QueueKeys.for_model("embed", "m")
    _live_worker(r, keys, "w1")
    r.sadd(queues_registry(), keys.queue)
    r.hset(keys.window("w1"), mapping={"window_ms": "2.5", "batches": "7", "mode": "window"})
    assert main(["stats", "--json", "--redis-url", redis_url]) == 0
    (queue,) = json.loads(capsys.readouterr().out)
    assert queue["windows"]["w1"] == {"window_ms": 2.5, "batches": 7, "mode": "window"}


# ------------------------------------------------------------- a hung server, a wrong port


def test_a_hung_server_fails_in_one_line_naming_it() -> None:
    with silent_server() as url:
        settings = ConnectionSettings(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        client = inferq.Client(settings)
        started = time.monotonic()
        with pytest.raises(inferq.BackendUnavailable) as caught:
            client.enqueue("x", model="m")
        assert time.monotonic() - started < 20  # one read timeout, not retried
        client.close()
    assert caught.value.message.startswith(
        f"no reply (timed out; is it a Redis server, and is it up?) at {url}: ")


def test_a_server_that_is_not_redis_fails_in_one_line_naming_it() -> None:
    with (http_server() as url, inferq.Client(url) as client,
          pytest.raises(inferq.BackendUnavailable) as caught):
        client.enqueue("x", model="m")
    assert caught.value.message.startswith(
        f"not a Redis server (protocol error; wrong port?) at {url}: ")


@pytest.mark.parametrize("command", [["stats"], ["enqueue", "x", "--model", "m"]])
def test_cli_against_a_hung_or_foreign_server_is_one_line(
        command: list[str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_REDIS_TIMEOUT_S", "2")
    with silent_server() as hung:
        assert main([*command, "--redis-url", hung]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"inferq: error [connection]: no reply (timed out; is it a Redis "
                          f"server, and is it up?) at {hung}: ")
    assert err.count("\n") == 1
    with http_server() as foreign:
        assert main([*command, "--redis-url", foreign]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"inferq: error [connection]: not a Redis server (protocol error; "
                          f"wrong port?) at {foreign}: ")
    assert err.count("\n") == 1


def test_a_long_wait_is_sliced_under_the_read_timeout(redis_url: str) -> None:
    """``result(timeout=...)`` longer than the socket's read timeout: a ResultTimeout at the
    caller's timeout, not a socket timeout (each BLMOVE blocks at most half of it)."""
    with inferq.Client(ConnectionSettings(redis_url, socket_timeout=2.0)) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", inferq.NoWorkerWarning)
            handle = client.enqueue("x", model="m")
        with pytest.raises(inferq.ResultTimeout):
            handle.result(timeout=2.5)


# -------------------------------------------------------------------------- SDK answers


@pytest.fixture
def client(redis_url: str) -> inferq.Client:
    c = inferq.Client(redis_url)
    warnings.simplefilter("ignore", inferq.NoWorkerWarning)
    return c


def test_cancel_returns_its_outcome(client: inferq.Client) -> None:
    handle = client.enqueue("x", model="m")
    first = handle.cancel()
    assert first is inferq.CancelOutcome.CANCELLED and first
    second = handle.cancel()
    assert second is inferq.CancelOutcome.DONE and not second
    unknown = client.handle("never-enqueued", model="m").cancel()
    assert unknown is inferq.CancelOutcome.UNKNOWN and not unknown


def test_info_reports_state_attempts_and_timings(client: inferq.Client, r: redis.Redis) -> None:
    handle = client.enqueue("x", model="m", max_attempts=5, deadline_s=60)
    info = handle.info()
    assert info.state is inferq.RequestState.PENDING and info.attempts == 0
    assert info.max_attempts == 5 and info.owner is None and info.result is None
    assert info.enqueued_ms is not None and info.deadline_ms is not None
    assert 59_000 <= info.deadline_ms - info.enqueued_ms <= 60_000
    handle.cancel()
    done = handle.info()
    assert done.state is inferq.RequestState.CANCELLED and done.result is not None
    assert done.finished_ms is not None and done.enqueued_ms == info.enqueued_ms
    missing = client.handle("nope", model="m").info()
    assert missing.state is inferq.RequestState.UNKNOWN and missing.enqueued_ms is None


def test_atomic_enqueue_many_is_all_or_none(redis_url: str, r: redis.Redis) -> None:
    keys = QueueKeys.for_model("embed", "m")
    options = inferq.ClientOptions(max_queue_depth=3)
    with inferq.Client(redis_url, options=options) as c, warnings.catch_warnings():
        warnings.simplefilter("ignore", inferq.NoWorkerWarning)
        c.enqueue("first", model="m")  # depth 1; normal priority may fill 80 %: 2
        with pytest.raises(inferq.QueueFull) as caught:
            c.enqueue_many(["a", "b"], model="m", atomic=True)
        assert caught.value.accepted == [] and caught.value.refused == [0, 1]
        assert r.zcard(keys.pending) == 1  # nothing of the batch got in
        with pytest.raises(inferq.QueueFull) as partial:
            c.enqueue_many(["a", "b"], model="m")  # not atomic: one gets in
        assert len(partial.value.accepted) == 1 and r.zcard(keys.pending) == 2
        with pytest.raises(inferq.ValidationError, match="one queue"):
            c.enqueue_many([{"prompt": "a", "model": "m"}, {"prompt": "b", "model": "n"}],
                           atomic=True)


def test_atomic_enqueue_many_needs_one_shard_of_a_sharded_queue(
        client: inferq.Client, r: redis.Redis) -> None:
    keys = QueueKeys.for_model("embed", "m")
    r.hset(keys.config, mapping={"shards": 3, "shards_seen": 3})
    ids = [f"id-{i}" for i in range(12)]  # crc32 spreads these over the 3 shards
    with pytest.raises(inferq.ValidationError) as caught:
        client.enqueue_many([{"prompt": "x", "id": i} for i in ids], model="m", atomic=True)
    assert caught.value.field == "atomic" and "one queue shard" in caught.value.message
    assert all(r.zcard(k.pending) == 0 for k in keys.shards(3))  # nothing queued
    handles = client.enqueue_many([{"prompt": "x", "id": i} for i in ids], model="m")
    assert {h.keys.shard for h in handles} == {0, 1, 2}


def test_validation_errors_name_their_field(client: inferq.Client, r: redis.Redis) -> None:
    with pytest.raises(inferq.ValidationError) as bad_priority:
        client.enqueue("x", model="m", priority=1000)
    assert bad_priority.value.field == "priority"
    for empty in ("", "   \n\t"):
        with pytest.raises(inferq.ValidationError) as caught:
            client.enqueue(empty, model="m")
        assert caught.value.field == "prompt"
        assert caught.value.message.startswith("prompt is empty or only whitespace")
    with pytest.raises(inferq.ValidationError) as in_many:
        client.enqueue_many(["ok", " "], model="m")
    assert in_many.value.field == "prompt" and in_many.value.message.startswith("request #1")
    assert r.zcard(QueueKeys.for_model("embed", "m").pending) == 0  # nothing queued


# ------------------------------------------------------------------------------ gateway


def test_gateway_answers_404_for_a_model_no_worker_served(make_api: MakeApi,
                                                         r: redis.Redis) -> None:
    with make_api(require_served_model=True) as api:
        response = api.post("/v1/embeddings", json={"input": "x", "model": "nosuchmodel"})
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "nosuchmodel" in error["message"]
        assert r.zcard(NOSUCH.pending) == 0  # nothing left waiting
        chat = api.post("/v1/chat/completions", json={
            "model": "nosuchmodel", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"
        assert api.get("/v1/models").json() == {"object": "list", "data": []}
        # A worker registers its queue when it starts: the model is listed and served.
        r.sadd(queues_registry(), "embed:echo", "generate:echo")
        models = api.get("/v1/models").json()["data"]
        assert models == [{"id": "echo", "object": "model", "created": 0, "owned_by": "inferq",
                           "tasks": ["embed", "generate"]}]
        assert api.get("/v1/models/echo").json()["id"] == "echo"
        assert api.get("/v1/models/nosuchmodel").status_code == 404
        queued = api.post("/v1/requests", json={"prompt": "x", "model": "echo"})
        assert queued.status_code == 202


def test_gateway_retry_after_comes_from_the_queue_estimate(make_api: MakeApi,
                                                           r: redis.Redis) -> None:
    keys = QueueKeys.for_model("embed", "echo")
    seconds, _ = r.time()
    # One completion in the last 10 s: 0.1/s, so one request over the limit drains in ~10 s.
    slot = (seconds - 1) % 64
    r.hset(keys.stats, mapping={f"ts:{slot}": seconds - 1, f"n:{slot}": 1})
    with make_api(max_queue_depth=1) as api:
        assert api.post("/v1/requests", json={"prompt": "a", "model": "echo"}).status_code == 202
        full = api.post("/v1/embeddings", json={"input": "b", "model": "echo"})
    assert full.status_code == 429
    assert full.headers["Retry-After"] == "10"
