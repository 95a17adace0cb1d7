"""Bearer-token auth for ``/v1/*`` (``INFERQ_GATEWAY_TOKEN``); health probes stay open."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from inferq.gateway.errors import ApiError

# auto_error=False: a missing header is our 401 (OpenAI-shaped), not FastAPI's default.
_bearer = HTTPBearer(auto_error=False, description="INFERQ_GATEWAY_TOKEN")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def bearer_auth(token: SecretStr | None) -> Callable[[Credentials], Awaitable[None]]:
    """A dependency that admits a request carrying ``Authorization: Bearer <token>``; with no
    token configured it admits every request."""
    expected = token.get_secret_value().encode() if token is not None else None

    async def require_token(credentials: Credentials) -> None:
        if expected is None:
            return
        given = credentials.credentials.encode() if credentials is not None else b""
        # Constant time in the token's content, so a timing attack cannot guess it byte by byte.
        if not secrets.compare_digest(given, expected):
            raise ApiError(401, "authentication_error", "invalid_api_key",
                           "missing or invalid bearer token",
                           headers={"WWW-Authenticate": "Bearer"})

    return require_token
