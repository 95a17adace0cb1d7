"""The compose stack in a real Docker engine (opt in: ``pytest -m docker tests/deploy``).

Needs a running Docker engine, the base images and the inferq image built locally
(``deploy/docker/build-base-images.sh``, ``deploy/docker/build-inferq-image.sh``; ``.ci/run``
does both when it can start ``dockerd``). Skips, saying why, when any is missing. Uses
``docker compose`` (v2) when the CLI has it, else Debian's ``docker-compose`` (v1, which
does not know the top-level ``name:``: it gets a copy without it).

One stack, checked as an operator would, in order: 3 workers come up; the producer demo
service gets its result; the gateway answers ``/v1/embeddings`` and lists the model; Prometheus
scrapes the 3 workers and answers the Grafana dashboard's queries with data; a worker killed
mid-run loses nothing; ``compose stop`` drains the workers cleanly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

import inferq
from inferq.embedded import free_port
from inferq.plans import run as run_plan
from inferq.protocol.keys import QueueKeys
from inferq.stats import live_workers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "inferqtest"
IMAGES = ("inferq:cpu", "redis:7", "prom/prometheus:v2.54.1")
SERVICES = ("redis", "worker", "gateway", "prometheus")  # grafana has no local image
MINILM = QueueKeys.for_model("embed", "minilm")
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "inferq.json"
#: Dashboard queries about generation or CUDA: an embedding stack on CPUs has no such series.
NOT_THIS_STACK = ("inferq_tokens_total", "inferq_device_memory_bytes", "inferq_running_sequences",
                  "inferq_generated_tokens_total", "inferq_time_to_first_token_seconds",
                  "inferq_oom_splits_total", "inferq_retries_total", "inferq_reclaims_total",
                  "inferq_dead_letters_total", "inferq_expired_total",
                  "inferq_refused_completions_total")


def _run(*cmd: str, timeout: float = 600, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return done


def _docker() -> str:
    return os.environ.get("INFERQ_DOCKER", "docker")


@dataclass
class Stack:
    compose: list[str]
    env: dict[str, str]
    redis_url: str
    gateway: str
    prometheus: str

    def __call__(self, *args: str, timeout: float = 600,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(*self.compose, *args, timeout=timeout, check=check, env=self.env)

    def workers(self) -> list[str]:
        return self("ps", "-q", "worker").stdout.split()


def _compose_command(tmp: Path) -> list[str]:
    base = ["-p", PROJECT, "--project-directory", str(ROOT)]
    if _run(_docker(), "compose", "version", check=False).returncode == 0:
        return [_docker(), "compose", *base, "-f", str(ROOT / "docker-compose.yml")]
    if shutil.which("docker-compose") is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    data.pop("name", None)  # compose v1 does not know it; -p names the project instead
    copy = tmp / "docker-compose.v1.yml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return ["docker-compose", *base, "-f", str(copy)]


def _wait(what: str, check: Any, timeout: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def _live(r: redis.Redis) -> list[str]:
    return run_plan(r, live_workers(MINILM))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if _run(_docker(), "info", check=False, timeout=30).returncode != 0:
        pytest.skip("no Docker engine answers (start dockerd)")
    missing = [i for i in IMAGES
               if _run(_docker(), "image", "inspect", i, check=False).returncode != 0]
    if missing:
        pytest.skip(f"images {missing} are not built: deploy/docker/build-base-images.sh and "
                    "deploy/docker/build-inferq-image.sh")
    ports = {"INFERQ_REDIS_PORT": free_port(), "INFERQ_GATEWAY_PORT": free_port(),
             "INFERQ_PROMETHEUS_PORT": free_port()}
    # vfs (the storage driver that runs everywhere) copies an image per container: creating
    # one takes longer than compose v1's 60 s HTTP timeout on a busy host.
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}, "INFERQ_DEVICE": "cpu",
           "COMPOSE_HTTP_TIMEOUT": "900", "DOCKER_CLIENT_TIMEOUT": "900"}
    s = Stack(_compose_command(tmp_path_factory.mktemp("compose")), env,
              f"redis://127.0.0.1:{ports['INFERQ_REDIS_PORT']}/0",
              f"http://127.0.0.1:{ports['INFERQ_GATEWAY_PORT']}",
              f"http://127.0.0.1:{ports['INFERQ_PROMETHEUS_PORT']}")
    s("down", "-v", "--remove-orphans", check=False)
    try:
        s("up", "-d", "--no-build", "--scale", "worker=3", *SERVICES, timeout=900)
        yield s
    finally:
        logs = s("logs", "--no-color", "--tail", "40", check=False).stdout
        s("down", "-v", "--remove-orphans", check=False, timeout=300)
        Path(os.environ.get("INFERQ_DOCKER_LOG", "/tmp/inferq-docker-test.log")).write_text(logs)


def _http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _prom(stack: Stack, query: str) -> list[Any]:
    url = f"{stack.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    answer = _http_json(url)
    assert answer["status"] == "success", answer
    result: list[Any] = answer["data"]["result"]
    return result


def test_the_compose_stack_in_a_real_engine(stack: Stack) -> None:
    r = redis.Redis.from_url(stack.redis_url)
    _wait("redis on its host port", lambda: _ping(r), 120)
    _wait("3 live workers", lambda: len(_live(r)) == 3, 600, every=2)

    # 1. The producer demo service (`docker compose --profile demo up producer-demo`).
    demo = stack("--profile", "demo", "run", "--rm", "--no-deps", "producer-demo", timeout=300)
    assert "embedding, 384 dimensions" in demo.stdout and "ok: id " in demo.stdout, demo.stdout

    # 2. The gateway: OpenAI-compatible embeddings, and the model it serves.
    _wait("the gateway", lambda: _ready(stack), 180)
    answer = _http_json(f"{stack.gateway}/v1/embeddings",
                        {"input": ["hello", "world"], "model": "minilm"})
    assert [len(d["embedding"]) for d in answer["data"]] == [384, 384]
    models = _http_json(f"{stack.gateway}/v1/models")["data"]
    assert [m["id"] for m in models] == ["minilm"]

    # 3. Prometheus scrapes the 3 workers, and the dashboard's queries have data.
    def targets_up() -> bool:
        active = _http_json(f"{stack.prometheus}/api/v1/targets")["data"]["activeTargets"]
        return len([t for t in active if t["health"] == "up"]) == 3
    _wait("3 worker targets up in Prometheus", targets_up, 180, every=2)
    with inferq.Client(stack.redis_url) as client:
        for _ in range(3):  # traffic for the rate() windows
            handles = client.enqueue_many([f"sentence {i}" for i in range(40)], model="minilm")
            assert all(h.result(timeout=300).ok for h in handles)
            time.sleep(6)
        # Queue depth has series only while requests wait: keep a backlog until it is seen.
        backlog: list[inferq.Handle] = []

        def depth_seen() -> bool:
            backlog.extend(client.enqueue_many([f"backlog {i}" for i in range(100)],
                                               model="minilm", priority=-5))
            return bool(_prom(stack, "max by (queue, priority) (inferq_queue_depth)"))
        _wait("queue depth in Prometheus", depth_seen, 120, every=1)
        assert all(h.result(timeout=600).ok for h in backlog)
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
             for t in p.get("targets", [])]
    assert exprs
    empty = [e for e in exprs if not _prom(stack, e) and not any(n in e for n in NOT_THIS_STACK)
             and "inferq_queue_depth" not in e]  # seen above, while the backlog waited
    assert not empty, f"dashboard queries without data: {empty}"
    assert len(_prom(stack, 'up{job="inferq-worker"} == 1')) == 3

    # 4. A worker killed mid-run: nothing lost (its leases expire, another worker reclaims).
    with inferq.Client(stack.redis_url) as client:
        handles = client.enqueue_many([f"kill test {i}" for i in range(300)], model="minilm")
        _wait("the run to start", lambda: sum(h.peek() is not None for h in handles[:60]) > 5,
              300, every=0.5)
        victim = stack.workers()[0]
        _run(_docker(), "kill", victim)
        results = [h.result(timeout=600) for h in handles]
    assert len(results) == 300 and all(res.ok for res in results)
    assert r.zcard(MINILM.inflight) == 0 and r.zcard(MINILM.pending) == 0

    # 5. `compose stop` drains: workers finish the batch in hand, give the rest back, exit 0.
    stack("up", "-d", "--no-build", "--scale", "worker=3", *SERVICES)
    _wait("3 live workers again", lambda: len(_live(r)) == 3, 600, every=2)
    with inferq.Client(stack.redis_url) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore", inferq.NoWorkerWarning)
        handles = client.enqueue_many([f"drain test {i}" for i in range(400)], model="minilm")
        _wait("the run to start", lambda: any(h.peek() is not None for h in handles), 300, 0.2)
        workers = stack.workers()
        stack("stop", "worker", timeout=300)
        codes = [_run(_docker(), "inspect", "-f", "{{.State.ExitCode}}", w).stdout.strip()
                 for w in workers]
        assert codes == ["0"] * len(workers), codes
        assert r.zcard(MINILM.inflight) == 0  # nothing left leased to a stopped worker
        done = sum(h.peek() is not None for h in handles)
        assert done + r.zcard(MINILM.pending) == len(handles)  # the rest waits in the queue
        stack("start", "worker")
        assert all(h.result(timeout=600).ok for h in handles)


def _ping(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.RedisError:
        return False


def _ready(stack: Stack) -> bool:
    try:
        return _http_json(f"{stack.gateway}/readyz", timeout=5)["status"] == "ready"
    except OSError:
        return False
