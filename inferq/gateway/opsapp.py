"""``inferq dashboard``: the operator's routes of ``inferq.gateway.admin`` (dashboard, dead
letters, request lookup, autoscaling signal) without the gateway's inference API, for a setup
without a gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from pydantic import SecretStr

import inferq
from inferq.connection import ConnectionSettings
from inferq.gateway import admin, errors
from inferq.gateway.routes import health
from inferq.producer.aio import AsyncClient
from inferq.producer.common import ClientOptions
from inferq.protocol.keys import DEFAULT_NAMESPACE


def create_ops_app(redis_url: str | ConnectionSettings | None, *, token: str | None,
                   namespace: str = DEFAULT_NAMESPACE) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = AsyncClient(redis_url, options=ClientOptions(namespace=namespace,
                                                              warn_no_worker=False))
        app.state.ops = admin.OpsState(client=client,
                                       token=SecretStr(token) if token else None)
        try:
            yield
        finally:
            await client.aclose()

    app = FastAPI(title="inferq dashboard", version=inferq.__version__, lifespan=lifespan)
    errors.install(app, retry_after_s=1)
    app.get("/healthz", include_in_schema=False)(health.healthz)
    app.include_router(admin.api, dependencies=admin.guarded(token or None))
    app.include_router(admin.open_routes)
    return app
