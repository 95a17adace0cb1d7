"""A fast path for ``POST /v1/embeddings``, the gateway's hot route.

FastAPI spends most of a small request's CPU outside the route: resolving its dependencies
(state, three optional headers, the body) and matching the route, about as much as
everything else the gateway does per call. This ASGI middleware serves the common case
directly: a JSON body that ``EmbeddingsRequest`` accepts and none of the ``X-Priority`` /
``X-Deadline-S`` / ``X-Timeout-S`` / ``X-Inferq-Tenant`` / ``X-Inferq-TTFT-SLO-Ms``
headers. It sits inside the front door (``frontdoor``), which has already admitted the
caller and bounds the body; the caller's principal (its tenant and priority ceiling)
applies here as in the route. It runs the very same code as the route
(``embeddings_response``) and renders errors with the same functions as the app's exception
handlers, so the answers are the same.

Everything else (a body that fails validation, those headers, any other path) goes to the
FastAPI app unchanged, with the body replayed: 422s naming the field and the OpenAPI schema
stay FastAPI's.
"""

from __future__ import annotations

from pydantic import ValidationError as PydanticValidationError
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.errors import InferqError
from inferq.gateway.caller import principal_of
from inferq.gateway.errors import error_response
from inferq.gateway.frontdoor import route_path
from inferq.gateway.routes.openai_compat import embeddings_response
from inferq.gateway.state import GatewayState
from inferq.openai.errors import ApiError, from_inferq, unavailable
from inferq.openai.schemas import EmbeddingsRequest

PATH = "/v1/embeddings"
_SLOW_HEADERS = frozenset({b"x-priority", b"x-deadline-s", b"x-timeout-s", b"x-inferq-tenant",
                           b"x-inferq-ttft-slo-ms"})


class EmbeddingsFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        #: Calls served here, and handed to FastAPI (for tests and logs).
        self.served = 0
        self.passed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or route_path(scope) != PATH):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        request = self._accept(scope, body)
        if request is None:
            self.passed += 1
            await self.app(scope, _replay(body, receive), send)
            return
        self.served += 1
        state = scope["app"].state.gateway
        assert isinstance(state, GatewayState)
        try:
            response = await embeddings_response(state, request, principal_of(scope))
        except ApiError as exc:
            response = error_response(exc)
        except InferqError as exc:
            response = error_response(
                from_inferq(exc, retry_after_s=state.settings.retry_after_s))
        except RedisError as exc:
            response = error_response(unavailable(exc))
        await response(scope, receive, send)

    def _accept(self, scope: Scope, body: bytes) -> EmbeddingsRequest | None:
        for name, value in scope["headers"]:
            if name in _SLOW_HEADERS:
                return None
            if name == b"content-type" and not value.lower().startswith(b"application/json"):
                return None
        try:
            return EmbeddingsRequest.model_validate_json(body)
        except (PydanticValidationError, ValueError):
            return None


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay

