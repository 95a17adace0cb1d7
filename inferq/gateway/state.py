"""What the routes share: the settings and one ``AsyncClient`` per app (created on startup,
inside the server's event loop)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from inferq.gateway.authn import Authenticator
from inferq.gateway.coalesce import Coalescer
from inferq.gateway.served import ServedQueues
from inferq.gateway.settings import GatewaySettings
from inferq.gateway.streams import StreamMux, StreamSlots
from inferq.openai.errors import ApiError, model_not_found
from inferq.producer.aio import AsyncClient, AsyncHandle
from inferq.protocol.prefix import user_session


@dataclass
class GatewayState:
    settings: GatewaySettings
    client: AsyncClient
    #: Who a bearer key or a dashboard session stands for (used by ``frontdoor``).
    auth: Authenticator
    #: A wait on a request this gateway did not enqueue (a repeated ``id``) blocks one pooled
    #: connection in ``BLMOVE``; bounding those waits keeps the pool free for everything else.
    blocking_waits: asyncio.Semaphore = field(init=False)
    #: The queues some worker has served (404 ``model_not_found`` for others).
    served: ServedQueues = field(init=False)
    #: Enqueues of concurrent embedding calls, sent as one ``enqueue_many`` per loop turn.
    coalescer: Coalescer = field(init=False)
    #: Every open event stream's reads, multiplexed off the shared pool, and their caps.
    streams: StreamMux = field(init=False)
    stream_slots: StreamSlots = field(init=False)

    def __post_init__(self) -> None:
        self.blocking_waits = asyncio.Semaphore(max(1, self.settings.max_connections // 4))
        self.served = ServedQueues()
        self.coalescer = Coalescer(self.client)
        self.streams = StreamMux(self.client.connection, self.client.options,
                                 self.client.redis)
        self.stream_slots = StreamSlots(self.settings.max_streams,
                                        self.settings.max_streams_per_tenant,
                                        self.settings.retry_after_s)

    async def require_served(self, task: str, model: str) -> None:
        """404 ``model_not_found`` unless a worker has served ``task:model`` (when
        ``require_served_model``)."""
        if self.settings.require_served_model and not await self.served.served(
                self.client, task, model):
            raise model_not_found(model, task)

    async def enqueue_many(self, prompts: list[str], **fields: Any) -> list[AsyncHandle]:
        """Through the coalescer unless ``INFERQ_GATEWAY_COALESCE=false``."""
        if self.settings.coalesce:
            return await self.coalescer.enqueue_many(prompts, **fields)
        return await self.client.enqueue_many(prompts, **fields)

    def tenant(self, user: str | None, header: str | None) -> str | None:
        """A call's tenant, from where ``INFERQ_GATEWAY_TENANT_FROM`` says (the SDK validates
        the name: a bad one is a 422 naming ``tenant``)."""
        source = self.settings.tenant_from
        return user if source == "user" else header if source == "header" else None

    def session(self, user: str | None, header: str | None) -> str | None:
        """A generation's session (cache affinity): ``X-Session-Id``, else OpenAI's ``user``
        where ``INFERQ_GATEWAY_SESSION_FROM_USER`` says so (hashed into a session id: any
        string is a valid ``user``)."""
        if header is not None:
            return header
        if user and self.settings.session_from_user:
            return user_session(user)
        return None

    def timeout(self, asked: float | None, param: str) -> float:
        """The caller's wait (seconds), else the default; above the maximum is a 422."""
        if asked is None:
            return self.settings.timeout_s
        if asked > self.settings.max_timeout_s:
            raise ApiError(422, "invalid_request_error", "invalid_request",
                           f"{param}: must be <= {self.settings.max_timeout_s} s, got {asked}",
                           param=param)
        return asked


async def get_state(request: Request) -> GatewayState:
    # async: FastAPI runs a plain ``def`` dependency on its thread pool, a thread hop per call.
    state = request.app.state.gateway
    assert isinstance(state, GatewayState), "the gateway's lifespan did not run"
    return state


State = Annotated[GatewayState, Depends(get_state)]
