"""The gateway's operator routes (``inferq.gateway.admin``): dead letters behind the token,
the request lookup, the overview the dashboard draws, the autoscaling signal, and the
dashboard's token form."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

import inferq
from inferq.gateway.admin import COOKIE
from tests.integration.test_dead_letters import kill_by_worker
from tests.integration.test_protocol import KEYS, Scripts

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")
AUTH = {"Authorization": "Bearer sesame"}


@pytest.fixture
def admin(make_api: Callable[..., AbstractContextManager[TestClient]]) -> Iterator[TestClient]:
    with make_api(token="sesame") as api:
        yield api


@pytest.fixture
def scripts(r: redis.Redis) -> Scripts:
    return Scripts(r)


def test_dead_letters_need_the_token_and_act_like_the_sdk(
        admin: TestClient, client: inferq.Client, scripts: Scripts, r: redis.Redis) -> None:
    for i in range(3):
        client.enqueue(f"p{i}", model="m", id=f"r{i}", max_attempts=1, priority=2)
    kill_by_worker(scripts, 2, code="model_error")
    kill_by_worker(scripts, 1, code="out_of_memory")
    base = "/admin/queues/embed:m/dead-letters"
    assert admin.get(base).status_code == 401
    assert admin.get(base, headers={"Authorization": "Bearer nope"}).status_code == 401
    listed = admin.get(base, headers=AUTH).json()
    assert listed["total"] == 3 and listed["cap"] == 100
    assert {x["id"] for x in listed["letters"]} == {"r0", "r1", "r2"}
    only = admin.get(base, params={"error_code": "out_of_memory"}, headers=AUTH).json()
    assert [x["id"] for x in only["letters"]] == ["r2"]
    one = admin.get(f"{base}/r0", headers=AUTH).json()
    assert one["priority"] == 2 and one["prompt_head"] == "p0" and one["requeueable"]
    assert admin.get(f"{base}/zzz", headers=AUTH).status_code == 404
    assert admin.post(f"{base}/requeue", json={}, headers=AUTH).status_code == 400
    assert admin.post(f"{base}/requeue", json={"ids": ["r0"]}).status_code == 401
    done = admin.post(f"{base}/requeue", json={"error_code": "model_error"}, headers=AUTH)
    assert sorted(done.json()["outcomes"]["requeued"]) == ["r0", "r1"]
    again = admin.post(f"{base}/requeue", json={"ids": ["r0"]}, headers=AUTH).json()
    assert again["outcomes"] == {"absent": ["r0"]}
    assert r.zcard(KEYS.pending) == 2
    purged = admin.post(f"{base}/purge", json={"all": True}, headers=AUTH).json()
    assert purged["outcomes"] == {"purged": ["r2"]} and r.zcard(KEYS.dead) == 0
    assert admin.get("/admin/queues/nocolon/dead-letters", headers=AUTH).status_code == 400


def test_request_lookup_and_overview(admin: TestClient, client: inferq.Client,
                                     scripts: Scripts) -> None:
    client.enqueue("hello", model="m", id="x1", priority=5)
    client.enqueue("poison", model="m", id="x2", max_attempts=1)
    assert admin.get("/admin/requests/x1").status_code == 401
    found = admin.get("/admin/requests/x1", headers=AUTH).json()
    assert found["state"] == "pending" and found["queue"] == "embed:m"
    assert admin.get("/admin/requests/nope", headers=AUTH).status_code == 404
    kill_by_worker(scripts, 1)  # x1, the higher priority
    view: dict[str, Any] = admin.get("/admin/overview", headers=AUTH).json()
    (queue,) = view["queues"]
    assert queue["queue"] == "embed:m" and queue["pending"] == 1
    assert queue["pending_by_priority"] == {"0": 1} and queue["dead_lettered"] == 1
    assert [x["id"] for x in queue["dead_letters"]["letters"]] == ["x1"]
    assert queue["desired_workers"] == 1  # a request waits: activation
    assert queue["slo"]["finished"] == 0 and queue["slo"]["ratio_p50"] is None


def test_the_overview_shows_goodput_and_the_prediction_s_error(
        admin: TestClient, client: inferq.Client, r: redis.Redis) -> None:
    client.enqueue("hello", model="m")
    seconds, micros = r.time()  # a live worker that published what it measured
    r.zadd(KEYS.workers, {"w1": seconds * 1000 + micros // 1000 + 60_000})
    r.hset(KEYS.window("w1"), mapping={"slo_met": "3", "slo_missed": "1",
                                       "slo_ratio": "0 0 0 0 2 0 0 0 2 0 0 0 0"})
    (queue,) = admin.get("/admin/overview", headers=AUTH).json()["queues"]
    assert queue["slo"] == {"met": 3, "finished": 4, "fraction": 0.75, "predicted": 4,
                            "ratio_p50": pytest.approx(1.0), "ratio_p90": pytest.approx(1.9)}


def test_the_signal_for_keda_and_prometheus(admin: TestClient, client: inferq.Client,
                                            redis_url: str) -> None:
    from inferq.cli.main import main
    assert main(["queue", "set", "embed:m", "--redis-url", redis_url, "--target-wait-ms",
                 "250", "--scale-to-zero-after", "2"]) == 0
    client.enqueue("a", model="m")
    signal = admin.get("/autoscale/embed:m", headers=AUTH).json()
    assert signal["desired"] == 1 and signal["backlog"] == 1
    assert signal["target_wait_ms"] == 250 and signal["scale_to_zero_after_s"] == 120
    assert admin.get("/autoscale/embed:m").status_code == 401
    every = admin.get("/autoscale", headers=AUTH).json()
    assert every["queues"]["embed:m"]["desired"] == 1
    assert admin.get("/metrics/autoscale").status_code == 401  # an autoscale key or better
    text = admin.get("/metrics/autoscale", headers=AUTH).text
    assert 'inferq_workers_desired{queue="embed:m"} 1' in text


def test_the_dashboard_signs_in_to_a_session_not_a_cookie_holding_the_token(
        admin: TestClient) -> None:
    page = admin.get("/dashboard")
    assert page.status_code == 200 and 'name="token"' in page.text
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    wrong = admin.post("/dashboard/login", content="token=nope", headers=form)
    assert wrong.status_code == 401 and "wrong key" in wrong.text
    assert admin.get("/admin/overview").status_code == 401
    right = admin.post("/dashboard/login", content="token=sesame", follow_redirects=False,
                       headers=form)
    cookie = right.headers["set-cookie"]
    assert right.status_code == 303 and COOKIE in cookie and "sesame" not in cookie
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Max-Age" in cookie
    assert "/admin/overview" in admin.get("/dashboard").text  # the client kept the cookie
    assert admin.get("/admin/overview").status_code == 200
    out = admin.post("/dashboard/logout", follow_redirects=False)
    assert out.status_code == 303
    admin.cookies.clear()
    admin.cookies.set(COOKIE, right.cookies[COOKIE])  # the old session id, replayed
    assert admin.get("/admin/overview").status_code == 401
    assert 'name="token"' in admin.get("/dashboard").text


def test_the_overview_combines_the_workers_queue_waits(admin: TestClient, client: inferq.Client,
                                                       r: redis.Redis) -> None:
    client.enqueue("a", model="m")
    (now_s, _) = r.time()
    for worker, p50, p99 in (("w1", 10, 90), ("w2", 30, 400), ("w3", 20, 100)):
        r.zadd(KEYS.workers, {worker: (now_s + 60) * 1000})  # live
        r.hset(KEYS.window(worker), mapping={"wait_p50_ms": p50, "wait_p99_ms": p99,
                                              "batches": 1})
    (queue,) = admin.get("/admin/overview", headers=AUTH).json()["queues"]
    assert queue["live_workers"] == ["w1", "w2", "w3"]
    assert (queue["wait_p50_ms"], queue["wait_p99_ms"]) == (20, 400)  # median p50, worst p99


def test_inferq_dashboard_serves_the_same_without_a_gateway(redis_url: str,
                                                           client: inferq.Client) -> None:
    from inferq.cli.main import build_parser
    from inferq.gateway.opsapp import create_ops_app

    args = build_parser().parse_args(["dashboard", "--port", "9999", "--token", "t"])
    assert (args.host, args.port, args.token) == ("127.0.0.1", 9999, "t")
    client.enqueue("a", model="m")
    with TestClient(create_ops_app(redis_url, token="t"), base_url="http://localhost") as ops:
        assert ops.get("/healthz").status_code == 200
        assert 'name="token"' in ops.get("/dashboard").text
        assert ops.get("/admin/overview").status_code == 401
        view = ops.get("/admin/overview", headers={"Authorization": "Bearer t"}).json()
        assert [q["queue"] for q in view["queues"]] == ["embed:m"]
        assert 'inferq_workers_desired{queue="embed:m"} 1' in ops.get(
            "/metrics/autoscale", headers={"Authorization": "Bearer t"}).text
        assert not any(p.startswith("/v1") for p in ops.get("/openapi.json").json()["paths"])


def test_the_overview_shows_cache_affinity_per_worker_and_summed(
        admin: TestClient, client: inferq.Client, r: redis.Redis) -> None:
    client.enqueue("hello", model="m")
    (now_s, _) = r.time()
    published = {"w1": {"prefix_prompt_tokens": "1000", "prefix_reused_tokens": "800",
                        "claimed": "10", "affinity_claimed": "7", "held_prefixes": "12"},
                 "w2": {"prefix_prompt_tokens": "3000", "prefix_reused_tokens": "1000",
                        "claimed": "10", "affinity_claimed": "1", "held_prefixes": "3"},
                 "w3": {"batches": "4"}}  # not a generate worker: no figures
    for worker, fields in published.items():
        r.zadd(KEYS.workers, {worker: (now_s + 60) * 1000})  # live
        r.hset(KEYS.window(worker), mapping=fields)
    (queue,) = admin.get("/admin/overview", headers=AUTH).json()["queues"]
    assert queue["workers"]["w1"]["affinity"] == {
        "prompt_tokens": 1000, "tokens_saved": 800, "hit_rate": 0.8, "claimed": 10,
        "affinity_claimed": 7, "claim_share": 0.7, "held_prefixes": 12}
    assert queue["workers"]["w3"]["affinity"] is None
    assert queue["affinity"] == {
        "prompt_tokens": 4000, "tokens_saved": 1800, "hit_rate": 0.45, "claimed": 20,
        "affinity_claimed": 8, "claim_share": 0.4, "held_prefixes": 15}


def test_the_overview_has_no_affinity_figures_without_a_worker_that_publishes_them(
        admin: TestClient, client: inferq.Client) -> None:
    client.enqueue("hello", model="m")
    (queue,) = admin.get("/admin/overview", headers=AUTH).json()["queues"]
    assert queue["affinity"] is None and queue["workers"] == {}
