"""Latency objectives against a real server: the objective stored with the request, deadline
order inside a band (priority still first), admission by prediction from the live workers'
published figures (``WouldMissSlo``, 429 at the gateway), and ``inferq queue set``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

import inferq
from inferq.cli.main import main
from inferq.protocol import ops
from inferq.protocol.codec import decode_request
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import SET_SETTINGS, settings_call
from tests.support.gateway import ECHO

KEYS = QueueKeys.for_model("embed", "slo")
NO_CACHE = inferq.ClientOptions(settings_ttl_s=0, warn_no_worker=False)


@pytest.fixture
def sc(redis_url: str) -> Iterator[inferq.Client]:
    with inferq.Client(redis_url, options=NO_CACHE) as c:
        yield c


def set_policy(r: redis.Redis, keys: QueueKeys = KEYS, **kw: str) -> None:
    call_keys, args = settings_call(keys.config, None, "keep", **kw)  # type: ignore[arg-type]
    r.register_script(SET_SETTINGS)(keys=call_keys, args=args)


def publish_worker(r: redis.Redis, keys: QueueKeys = KEYS, *, batch_ms: float = 100,
                   batch_limit: int = 1) -> None:
    """A live worker whose published fit serves ``batch_limit / batch_ms`` requests a ms."""
    seconds, micros = r.time()
    r.zadd(keys.workers, {"w1": seconds * 1000 + micros // 1000 + 60_000})
    r.hset(keys.window("w1"), mapping={"latency_a_ms": "0", "latency_b_ms": str(batch_ms),
                                       "batch_limit": str(batch_limit), "batches": "5"})


def claim(r: redis.Redis, n: int, keys: QueueKeys = KEYS) -> list[str]:
    call_keys, args = ops.claim_call(keys, "w", 60_000, n, 60_000)
    return [c.id for c in ops.parse_claim(ops.register(r)["claim"](keys=call_keys,
                                                                   args=args)).claimed]


def payload_of(r: redis.Redis, keys: QueueKeys, request_id: str) -> inferq.Result | object:
    raw = r.hget(keys.request(request_id), Field.PAYLOAD.value)
    assert raw is not None
    return decode_request(raw)


def test_the_objective_is_stored_and_checked(sc: inferq.Client, r: redis.Redis) -> None:
    sc.enqueue("x", model="slo", id="a", ttft_slo_ms=250)
    sc.enqueue_many([{"prompt": "y", "id": "b", "ttft_slo_ms": 9}, "z"], model="slo")
    assert payload_of(r, KEYS, "a").ttft_slo_ms == 250  # type: ignore[attr-defined]
    assert payload_of(r, KEYS, "b").ttft_slo_ms == 9  # type: ignore[attr-defined]
    for bad in (0, -1, True, 1.5, "10", 86_400_001):
        with pytest.raises(inferq.ValidationError):
            sc.enqueue("x", model="slo", ttft_slo_ms=bad)  # type: ignore[arg-type]


def test_fair_order_ignores_objectives(sc: inferq.Client, r: redis.Redis) -> None:
    for i, objective in enumerate([None, 5000, 100, None]):
        sc.enqueue("x", model="slo", id=f"r{i}", ttft_slo_ms=objective)
    assert claim(r, 10) == ["r0", "r1", "r2", "r3"]


def test_deadline_order_is_earliest_objective_first_within_priority(
        sc: inferq.Client, r: redis.Redis) -> None:
    set_policy(r, order="deadline")
    spec = [("a", 0, None), ("b", 0, 5000), ("c", 0, 1000), ("d", 0, None), ("e", 0, 1000),
            ("f", 5, 100_000), ("g", 5, None), ("h", -5, 1), ("i", 0, 60_000)]
    for request_id, priority, objective in spec:
        sc.enqueue("x", model="slo", id=request_id, priority=priority, ttft_slo_ms=objective)
    # priority first; in a band: by deadline (ties in arrival order), then the others in
    # fair order (FIFO without tenants)
    assert claim(r, 20) == ["f", "g", "c", "e", "b", "i", "a", "d", "h"]


def test_deadline_order_keeps_fair_shares_among_requests_without_objectives(
        sc: inferq.Client, r: redis.Redis) -> None:
    set_policy(r, order="deadline")
    sc.enqueue_many([{"prompt": "x", "id": f"a-{i}", "tenant": "a"} for i in range(6)]
                    + [{"prompt": "x", "id": f"b-{i}", "tenant": "b"} for i in range(6)]
                    + [{"prompt": "x", "id": "s", "tenant": "b", "ttft_slo_ms": 500}],
                    model="slo")
    order = claim(r, 20)
    assert order[0] == "s"
    # the rest alternate between the tenants, as fair order does
    assert [x[0] for x in order[1:5]] in (["a", "b", "a", "b"], ["b", "a", "b", "a"])


def test_the_deadline_base_follows_the_band(sc: inferq.Client, r: redis.Redis) -> None:
    set_policy(r, order="deadline")
    sc.enqueue("x", model="slo", id="one", ttft_slo_ms=1000)
    first = r.zscore(KEYS.pending, "one")
    assert claim(r, 1) == ["one"]
    # the band's first half emptied: the next request's offset starts again near 0
    sc.enqueue("x", model="slo", id="two", ttft_slo_ms=1000)
    second = r.zscore(KEYS.pending, "two")
    assert first is not None and second is not None and abs(second - first) < 256 * 50


def test_admission_refuses_what_would_miss_its_objective(
        sc: inferq.Client, r: redis.Redis) -> None:
    set_policy(r, order="deadline", admission="predicted")
    publish_worker(r)  # 10 requests a second
    kept = [sc.enqueue("x", model="slo", id=f"k{i}", ttft_slo_ms=250) for i in range(2)]
    assert [h.predicted_ms for h in kept] == [100, 200]
    with pytest.raises(inferq.WouldMissSlo) as refused:
        sc.enqueue("x", model="slo", id="late", ttft_slo_ms=250)
    assert (refused.value.predicted_ms, refused.value.slo_ms) == (300, 250)
    assert refused.value.code == "would_miss_slo" and isinstance(refused.value, inferq.QueueFull)
    assert refused.value.retry_after_s > 0
    assert r.exists(KEYS.request("late")) == 0
    # a tighter objective goes ahead of the queued ones, so it is admitted
    assert sc.enqueue("x", model="slo", id="tight", ttft_slo_ms=150).predicted_ms == 100
    # a request without an objective is always admitted
    assert sc.enqueue("x", model="slo", id="free").predicted_ms is None
    assert claim(r, 1) == ["tight"]
    # what runs is ahead of every new request: k0, k1 pending and tight under lease
    assert sc.enqueue("x", model="slo", id="after", ttft_slo_ms=5000).predicted_ms == 400
    assert claim(r, 10) == ["k0", "k1", "after", "free"]


def test_admission_in_enqueue_many_and_atomic(sc: inferq.Client, r: redis.Redis) -> None:
    set_policy(r, admission="predicted")
    publish_worker(r)
    with pytest.raises(inferq.WouldMissSlo) as refused:
        sc.enqueue_many([{"prompt": "x", "id": f"m{i}", "ttft_slo_ms": 250}
                         for i in range(4)], model="slo")
    assert [h.id for h in refused.value.accepted] == ["m0", "m1"]
    assert refused.value.refused == [2, 3]
    with pytest.raises(inferq.WouldMissSlo):
        sc.enqueue_many([{"prompt": "x", "id": "n0", "ttft_slo_ms": 5000},
                         {"prompt": "x", "id": "n1", "ttft_slo_ms": 1}], model="slo",
                        atomic=True)
    assert r.zcard(KEYS.pending) == 2


def test_without_a_live_worker_admission_admits(sc: inferq.Client, r: redis.Redis) -> None:
    set_policy(r, admission="predicted")
    handles = [sc.enqueue("x", model="slo", ttft_slo_ms=1) for _ in range(3)]
    assert all(h.predicted_ms is None for h in handles)


def test_the_cli_sets_and_shows_the_policy(redis_url: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "set", "embed:slo", "--order", "deadline", "--admission",
                 "predicted", "--redis-url", redis_url]) == 0
    assert "order deadline, admission predicted" in capsys.readouterr().out
    assert main(["queue", "show", "embed:slo", "--json", "--redis-url", redis_url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["order"], data["admission"]) == ("deadline", "predicted")
    assert "service_rate" not in data  # read by producers, not stored
    assert main(["queue", "set", "embed:slo", "--order", "fair", "--redis-url", redis_url]) == 0
    assert "order fair, admission predicted" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["queue", "set", "embed:slo", "--order", "edf", "--redis-url", redis_url])


def test_the_gateway_passes_the_header_and_answers_429(api: TestClient,
                                                       r: redis.Redis) -> None:
    generate = QueueKeys.for_model("generate", "echo")
    for keys in (ECHO, generate):  # set before the gateway first reads (and caches) them
        set_policy(r, keys, admission="predicted")
        publish_worker(r, keys, batch_ms=10_000)  # 0.1 a second: any 1 s objective is missed
    other = QueueKeys.for_model("embed", "other")
    created = api.post("/v1/requests", json={"prompt": "p", "model": "other"},
                       headers={"X-Inferq-TTFT-SLO-Ms": "700"})
    assert created.status_code == 202, created.text
    assert payload_of(r, other, created.json()["id"]).ttft_slo_ms == 700  # type: ignore[attr-defined]
    bad = api.post("/v1/requests", json={"prompt": "p", "model": "other"},
                   headers={"X-Inferq-TTFT-SLO-Ms": "0"})
    assert bad.status_code == 422
    refused = [
        api.post("/v1/requests", json={"prompt": "p", "model": "echo"},
                 headers={"X-Inferq-TTFT-SLO-Ms": "1000"}),
        api.post("/v1/embeddings", json={"input": ["a", "b"], "model": "echo"},
                 headers={"X-Inferq-TTFT-SLO-Ms": "1000"}),
        api.post("/v1/chat/completions",
                 json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
                 headers={"X-Inferq-TTFT-SLO-Ms": "1000"})]
    for response in refused:
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "would_miss_slo"
        assert int(response.headers["Retry-After"]) >= 1
    assert r.zcard(ECHO.pending) == 0 and r.zcard(generate.pending) == 0


def test_a_saturated_queue_is_predicted_at_its_measured_completion_rate(
        sc: inferq.Client, r: redis.Redis) -> None:
    set_policy(r, admission="predicted")
    publish_worker(r, batch_ms=1)  # the fit says 1000 a second
    sc.enqueue("x", model="slo", id="idle", ttft_slo_ms=1000)  # nothing waits: the fit
    seconds = int(r.time()[0])
    for sec in range(seconds - 10, seconds):  # 2 completions a second, lately
        r.hset(KEYS.stats, mapping={f"ts:{sec % 64}": sec, f"n:{sec % 64}": 2})
    sc.enqueue("x", model="slo", id="second")
    with pytest.raises(inferq.WouldMissSlo) as refused:  # 2 ahead: (2 + 1) / 2 s
        sc.enqueue("x", model="slo", id="late", ttft_slo_ms=1000)
    assert refused.value.predicted_ms in (1500, 1667)  # 1667: a second turned meanwhile


async def test_a_window_worker_reports_and_counts_whether_objectives_were_met(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    from inferq.stats import read_window
    from inferq.worker.models.builtin import EchoModel
    from inferq.worker.window.worker import WindowWorker
    from tests.support.window_worker import KEYS as WORKER_KEYS
    from tests.support.window_worker import config, run_worker, stop

    # queued before the worker starts: 1 ms is over before it can be served
    handles = await aclient.enqueue_many([{"prompt": "met", "ttft_slo_ms": 60_000},
                                          {"prompt": "missed", "ttft_slo_ms": 1}, "none"],
                                         model="t")
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    results = [await h.result(timeout=30) for h in handles]
    await stop(worker, task)
    assert [x.slo_met for x in results] == [True, False, None]
    assert worker.metrics.registry.get_sample_value(
        "inferq_slo_met_total", {"queue": "embed:t", "met": "false"}) == 1
    published = read_window(r, WORKER_KEYS, "test-worker")  # what inferq stats sums
    assert (published["slo_met"], published["slo_missed"]) == (1, 1)


async def test_a_generate_worker_judges_the_first_token(gen_worker: Any,
                                                       aclient: inferq.AsyncClient) -> None:
    from tests.support.generation import MODEL

    await gen_worker(max_slots=4)
    handles = await aclient.enqueue_many(
        [{"prompt": "hello there", "ttft_slo_ms": 60_000},
         {"prompt": "hello again", "ttft_slo_ms": 1}, "plain"],
        model=MODEL, task="generate", params={"max_new_tokens": 4})
    results = [await h.result(timeout=60) for h in handles]
    assert all(x.ttft_ms is not None for x in results)
    assert [x.slo_met for x in results] == [True, results[1].ttft_ms <= 1, None]  # type: ignore[operator]


async def test_admitted_requests_carry_their_prediction_to_the_worker(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient,
        capsys: pytest.CaptureFixture[str]) -> None:
    from inferq.protocol import slo
    from inferq.stats import read_window
    from inferq.worker.models.builtin import EchoModel
    from inferq.worker.window.worker import WindowWorker
    from tests.support.window_worker import KEYS as WORKER_KEYS
    from tests.support.window_worker import config, run_worker, stop

    set_policy(r, WORKER_KEYS, admission="predicted")
    publish_worker(r, WORKER_KEYS, batch_ms=100)  # 10 a second: 100 ms, then 200 ms
    async with inferq.AsyncClient(redis_url, options=NO_CACHE) as client:
        handles = await client.enqueue_many([{"prompt": "a", "ttft_slo_ms": 60_000},
                                             {"prompt": "b", "ttft_slo_ms": 60_000},
                                             "no objective"], model="t")
    assert [h.predicted_ms for h in handles] == [100, 200, None]
    stored = [r.hget(WORKER_KEYS.request(h.id), Field.PREDICTED.value) for h in handles]
    assert stored == [b"100", b"200", None]
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    results = [await aclient.handle(h.id, model="t").result(timeout=30) for h in handles]
    counts = [0] * (len(slo.RATIO_BUCKETS) + 1)
    for h, result in zip(handles[:2], results[:2], strict=True):
        assert result.finished_ms is not None and result.enqueued_ms is not None
        counts[slo.ratio_bucket((result.finished_ms - result.enqueued_ms)
                                / h.predicted_ms)] += 1  # type: ignore[operator]
    await stop(worker, task)
    assert worker.metrics.registry.get_sample_value(
        "inferq_slo_prediction_ratio_count", {"queue": "embed:t"}) == 2
    assert slo.ratio_counts(read_window(r, WORKER_KEYS, "test-worker")["slo_ratio"]) == counts


def test_generate_admission_predicts_in_tokens(sc: inferq.Client, r: redis.Redis) -> None:
    keys = QueueKeys.for_model("generate", "g")
    set_policy(r, keys, admission="predicted")
    seconds, micros = r.time()
    r.zadd(keys.workers, {"g1": seconds * 1000 + micros // 1000 + 60_000})
    # a step of 2 sequences takes 100 ms: 20 tokens a second with both slots busy
    r.hset(keys.window("g1"), mapping={"mode": "continuous", "decode_a_ms": "0",
                                       "decode_b_ms": "100", "max_slots": "2"})
    ask = {"model": "g", "task": "generate", "params": {"max_new_tokens": 9}}  # 10 tokens
    first = sc.enqueue("abcd", **ask, ttft_slo_ms=150)  # type: ignore[arg-type]
    second = sc.enqueue("abcd", **ask, ttft_slo_ms=150)  # type: ignore[arg-type]
    assert (first.predicted_ms, second.predicted_ms) == (100, 100)  # a slot each: one step
    # the two pending (10 tokens each) hold both slots: one must finish first
    with pytest.raises(inferq.WouldMissSlo) as refused:
        sc.enqueue("abcd", **ask, ttft_slo_ms=500)  # type: ignore[arg-type]
    assert refused.value.predicted_ms == 600  # (10 + 2) tokens / 20 a second
    third = sc.enqueue("abcd", **ask, ttft_slo_ms=600)  # type: ignore[arg-type]
    assert third.predicted_ms == 600
    claim(r, 1, keys)  # one runs now: still ahead of the next, as are the two pending
    with pytest.raises(inferq.WouldMissSlo) as refused:
        sc.enqueue("abcd", **ask, ttft_slo_ms=1000)  # type: ignore[arg-type]
    assert refused.value.predicted_ms == 1100  # 2 must finish first: (2 * 10 + 2) / 20
