"""The gateway under test: its token, a real uvicorn server in a thread, and request helpers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from inferq.embedded import free_port
from inferq.protocol.keys import QueueKeys

if TYPE_CHECKING:  # the gateway and openai load slowly: only the tests that use them pay
    from fastapi.testclient import TestClient
    from openai.types.chat import ChatCompletionMessageParam

    from inferq.gateway import GatewaySettings

TOKEN = "s3cret-token"
ECHO = QueueKeys.for_model("embed", "echo")
MakeApi = Callable[..., AbstractContextManager["TestClient"]]  # the make_api fixture
CHAT: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the queue."}]


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def state_of(api: TestClient, request_id: str, model: str = "echo") -> str:
    status: str = api.get(f"/v1/requests/{request_id}", params={"model": model}).json()["status"]
    return status


@contextmanager
def serve(settings: GatewaySettings) -> Iterator[str]:
    """A real uvicorn server for ``settings`` in a thread (uvicorn skips signal handlers off the
    main thread); yields its ``/v1`` base URL."""
    import uvicorn

    from inferq.gateway import create_app

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
