"""The bearer scheme as the OpenAPI schema declares it. Authentication itself happens in the
front door (``frontdoor``), before a route runs or a body is read; this dependency checks
nothing."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

# auto_error=False: the front door answers a missing key (OpenAI-shaped), not FastAPI.
_bearer = HTTPBearer(auto_error=False,
                     description="an API key (inferq keys create) or INFERQ_GATEWAY_TOKEN")


async def declared_bearer(
        _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Declares ``Authorization: Bearer`` in the schema."""
