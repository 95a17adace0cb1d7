"""``inferq dashboard``: the operator's routes of ``inferq.gateway.admin`` (dashboard, dead
letters, request lookup, autoscaling signal) without the gateway's inference API, for a setup
without a gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from pydantic import SecretStr

import inferq
from inferq.connection import ConnectionSettings
from inferq.gateway import admin, errors
from inferq.gateway.auth import declared_bearer
from inferq.gateway.authn import Authenticator
from inferq.gateway.frontdoor import FrontDoor
from inferq.gateway.routes import health
from inferq.producer.aio import AsyncClient
from inferq.producer.options import ClientOptions
from inferq.protocol.keys import DEFAULT_NAMESPACE, TenancyKeys


def create_ops_app(redis_url: str | ConnectionSettings | None, *, token: str | None,
                   namespace: str = DEFAULT_NAMESPACE,
                   allowed_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
                   ) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = AsyncClient(redis_url, options=ClientOptions(namespace=namespace,
                                                              warn_no_worker=False))
        auth = Authenticator(client.redis, TenancyKeys(namespace),
                             SecretStr(token) if token else None)
        app.state.auth = auth
        app.state.ops = admin.OpsState(client=client, auth=auth)
        try:
            yield
        finally:
            await client.aclose()

    app = FastAPI(title="inferq dashboard", version=inferq.__version__, lifespan=lifespan)
    errors.install(app, retry_after_s=1)
    app.get("/healthz", include_in_schema=False)(health.healthz)
    app.include_router(admin.api, dependencies=[Depends(declared_bearer)])
    app.include_router(admin.open_routes)
    # Outermost: callers are admitted (an admin key, the token, or a dashboard session)
    # before any route runs; the dashboard takes no uploads.
    app.add_middleware(FrontDoor, max_body_bytes=1 << 20, max_file_bytes=0,
                       allowed_hosts=allowed_hosts)
    return app
