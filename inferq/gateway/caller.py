"""The principal a request was admitted as (``frontdoor`` sets it before the body is read),
as a FastAPI dependency, and the checks routes make with it."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import Depends, Request
from starlette.types import Scope

from inferq.openai.errors import ApiError
from inferq.tenancy.principal import Principal

SCOPE_KEY = "inferq.principal"
_OPERATOR = Principal.operator()


def principal_of(scope: Scope) -> Principal:
    """The caller of an ASGI request; the operator where no front door ran (an app mounted
    without it, in tests of single routes)."""
    principal = scope.get(SCOPE_KEY)
    return principal if isinstance(principal, Principal) else _OPERATOR


async def get_caller(request: Request) -> Principal:
    return principal_of(request.scope)


Caller = Annotated[Principal, Depends(get_caller)]


def check_priority(caller: Principal, priority: int, param: str = "priority") -> int:
    """``priority``, or 403 naming the key's ceiling."""
    reason = caller.priority_refusal(priority)
    if reason is not None:
        raise ApiError(403, "permission_error", "priority_not_allowed", reason, param=param)
    return priority


def tenant_of(caller: Principal, requested: str | None) -> str | None:
    """A request's tenant: its key's; only a caller without one (the operator) may name one
    (where ``INFERQ_GATEWAY_TENANT_FROM`` lets it)."""
    return caller.tenant if caller.tenant is not None else requested


def new_request_id(caller: Principal, given: str | None) -> str | None:
    """The stored id of a new request: the caller's id (or a fresh one) in its tenant's name
    space; None for the operator without an id (the SDK makes one)."""
    if given is None:
        return None if caller.tenant is None else caller.stored_id(uuid.uuid4().hex)
    return caller.stored_id(given)
