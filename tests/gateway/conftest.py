"""Gateway fixtures: the app over the session's real Redis-compatible server."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from inferq.embedded import free_port
from inferq.gateway import GatewaySettings, create_app

TOKEN = "s3cret-token"


@pytest.fixture(autouse=True)
def _no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are explicit in these tests: the developer's environment must not leak in."""
    for name in list(os.environ):
        if name.startswith("INFERQ_GATEWAY_") or name == "INFERQ_REDIS_URL":
            monkeypatch.delenv(name)


@pytest.fixture
def make_api(redis_url: str) -> Callable[..., AbstractContextManager[TestClient]]:
    """``with make_api(token=..., max_queue_depth=...) as api:`` a TestClient whose app (and
    its lifespan: the shared AsyncClient) runs for the block."""

    @contextmanager
    def make(**overrides: Any) -> Iterator[TestClient]:
        values: dict[str, Any] = {"redis_url": redis_url, "token": None, "timeout_s": 30.0,
                                  **overrides}
        with TestClient(create_app(GatewaySettings(**values))) as api:
            yield api

    return make


@pytest.fixture
def api(make_api: Callable[..., AbstractContextManager[TestClient]]) -> Iterator[TestClient]:
    with make_api() as client:
        yield client


@contextmanager
def serve(settings: GatewaySettings) -> Iterator[str]:
    """A real uvicorn server for ``settings`` in a thread (uvicorn skips signal handlers off the
    main thread); yields its ``/v1`` base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
