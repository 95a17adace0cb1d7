"""The app factory: ``create_app(settings)`` wires settings, the shared ``AsyncClient``
(opened on startup in the server's loop, closed on shutdown), auth, routes and the error
mapping."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

import inferq
from inferq import tracing
from inferq.gateway import admin, errors, usage_routes
from inferq.gateway.auth import declared_bearer
from inferq.gateway.authn import Authenticator
from inferq.gateway.batch_state import BatchState
from inferq.gateway.fastpath import EmbeddingsFastPath
from inferq.gateway.frontdoor import FrontDoor
from inferq.gateway.routes import batches, completions, files, health, models, native, openai_compat
from inferq.gateway.settings import GatewaySettings
from inferq.gateway.state import GatewayState
from inferq.gateway.tracecontext import TraceContext
from inferq.producer.aio import AsyncClient
from inferq.producer.options import ClientOptions
from inferq.protocol.keys import TenancyKeys

log = logging.getLogger("inferq.gateway")


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings if settings is not None else GatewaySettings.from_env()
    tracing.setup("inferq-gateway")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A model no worker serves is a 404 here, not a warning.
        options = ClientOptions(namespace=settings.namespace,
                                max_queue_depth=settings.max_queue_depth,
                                max_connections=settings.max_connections, warn_no_worker=False)
        client = AsyncClient(settings.redis_url.get_secret_value(), options=options)
        auth = Authenticator(client.redis, TenancyKeys(settings.namespace), settings.token)
        app.state.auth = auth
        app.state.gateway = GatewayState(settings=settings, client=client, auth=auth)
        app.state.batch = BatchState.open(settings, client)
        app.state.ops = admin.OpsState(client=client, auth=auth)
        log.info("inferq gateway: redis %s, auth %s", settings.redacted_redis_url,
                 "the operator's token and API keys" if settings.token is not None else
                 "API keys (open to the allowed hosts while none exists)")
        try:
            yield
        finally:
            await app.state.gateway.streams.aclose()
            await app.state.batch.close()
            await client.aclose()

    app = FastAPI(title="inferq gateway", version=inferq.__version__, lifespan=lifespan,
                  description="HTTP front of the inferq queue: OpenAI-compatible embeddings, "
                              "completions and chat completions (streamed as server-sent "
                              "events), and inferq's native request API.")
    errors.install(app, retry_after_s=settings.retry_after_s)
    if settings.fast_path:
        app.add_middleware(EmbeddingsFastPath)
    app.add_middleware(TraceContext)  # inside the front door: for admitted callers only
    # Added last, so outermost: nothing runs, and no body is read, before it admits a caller.
    app.add_middleware(FrontDoor, max_body_bytes=int(settings.max_body_mb * (1 << 20)),
                       max_file_bytes=settings.max_file_bytes,
                       allowed_hosts=settings.allowed_host_names)
    authenticated = [Depends(declared_bearer)]
    app.include_router(health.router)
    app.include_router(openai_compat.router, dependencies=authenticated)
    app.include_router(completions.router, dependencies=authenticated)
    app.include_router(native.router, dependencies=authenticated)
    app.include_router(models.router, dependencies=authenticated)
    app.include_router(files.router, dependencies=authenticated)
    app.include_router(batches.router, dependencies=authenticated)
    app.include_router(admin.api, dependencies=authenticated)  # or the dashboard's session
    app.include_router(admin.open_routes)
    app.include_router(usage_routes.admin_usage, dependencies=authenticated)
    app.include_router(usage_routes.usage_metrics, dependencies=authenticated)
    return app
