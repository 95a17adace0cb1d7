"""The gateway's front door: the outermost ASGI layer, run before any route reads a byte of
the body.

For each HTTP request, in order:

1. A browser's cross-site state change is refused (``Sec-Fetch-Site: cross-site`` on a
   method other than GET/HEAD/OPTIONS): no page elsewhere can make a visitor's browser
   upload, cancel or purge.
2. While the gateway is open (no token, no key: see ``authn``) it serves loopback only: the
   ``Host`` must be one of ``INFERQ_GATEWAY_ALLOWED_HOSTS`` (DNS rebinding), and an
   ``Origin``, when sent, too.
3. Otherwise every route but the probes, the schema and the dashboard's own pages needs a
   principal, from the ``Authorization: Bearer`` header alone (the admin family also takes
   the dashboard's session cookie), whose scopes admit the route's family: ``/admin`` needs
   admin, and so does ``/metrics/usage`` (every tenant's usage); ``/autoscale`` and
   ``/metrics/autoscale`` autoscale (or admin); the rest api (or admin). 401 without one,
   403 when its scopes do not reach.
4. The body is then handed on through a counting ``receive``: a ``Content-Length`` over the
   route's limit is a 413 at once, and a body that streams past it is cut off with a 413
   (``BodyTooLarge``), so no caller makes the gateway buffer more than the limit:
   ``INFERQ_GATEWAY_MAX_FILE_MB`` on ``POST /v1/files``, 64 KiB on the dashboard's forms,
   ``INFERQ_GATEWAY_MAX_BODY_MB`` elsewhere.

Every response carries ``X-Content-Type-Options: nosniff`` and ``X-Frame-Options: DENY``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import HTTPException
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.gateway.authn import Authenticator
from inferq.gateway.caller import SCOPE_KEY
from inferq.gateway.errors import error_response
from inferq.openai.errors import INVALID, ApiError, unavailable
from inferq.tenancy import sessions
from inferq.tenancy.principal import Principal

MB = 1 << 20
FORM_LIMIT = 64 << 10
#: The probes: answered before anything else (they name no state, and must not fail with the
#: Redis that authentication reads; ``/readyz`` reports that itself).
PROBES = frozenset({"/healthz", "/readyz"})
#: Routes open to anyone: the schema and docs, and the dashboard's sign-in pages (which check
#: their session themselves).
OPEN_PATHS = frozenset({"/openapi.json", "/docs", "/redoc",
                        "/docs/oauth2-redirect", "/dashboard", "/dashboard/login",
                        "/dashboard/logout"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY")]


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes its limit; FastAPI re-raises an
    ``HTTPException`` from body parsing as it is, so this is a 413 wherever it is read."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the limit of {limit} bytes")
        self.limit = limit


def family_of(path: str) -> str:
    if path == "/admin" or path.startswith("/admin/") or path == "/metrics/usage":
        return "admin"
    if path in ("/autoscale", "/metrics/autoscale") or path.startswith("/autoscale/"):
        return "autoscale"
    return "api"


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def host_of(value: str) -> str:
    """``example.com:8000`` -> ``example.com``; ``[::1]:8000`` -> ``::1``."""
    if value.startswith("["):
        return value[1:].partition("]")[0].lower()
    return value.rpartition(":")[0].lower() if value.count(":") == 1 else value.lower()


class FrontDoor:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_file_bytes: int,
                 allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.max_body = max_body_bytes
        #: The file itself is checked by the route; this leaves room for the multipart frame.
        self.max_file = max_file_bytes + FORM_LIMIT
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_security_headers(send)
        path = route_path(scope)
        if path in PROBES:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope["headers"])
        method: str = scope["method"]
        try:
            principal = await self._admit(scope, headers, path, method)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        except RedisError as exc:
            await error_response(unavailable(exc))(scope, receive, send)
            return
        scope[SCOPE_KEY] = principal
        limit = self._limit(path, method)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _too_large(limit)(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _bounded(receive, limit), tracked)
        except BodyTooLarge:
            if started:
                raise
            await _too_large(limit)(scope, receive, send)

    async def _admit(self, scope: Scope, headers: dict[str, str], path: str,
                     method: str) -> Principal:
        if method not in SAFE_METHODS and headers.get("sec-fetch-site") == "cross-site":
            raise ApiError(403, "permission_error", "cross_site",
                           "a cross-site request may not change state")
        auth: Authenticator = scope["app"].state.auth
        if await auth.is_open():
            self._check_local(headers)
            return Principal.operator()
        if path in OPEN_PATHS:
            return Principal.operator()  # those routes check their own session
        family = family_of(path)
        principal = await self._principal(auth, headers, family)
        if principal is None:
            raise ApiError(401, "authentication_error", "invalid_api_key",
                           "missing or invalid API key (Authorization: Bearer <key>)",
                           headers={"WWW-Authenticate": "Bearer"})
        if not principal.admits(family):
            raise ApiError(403, "permission_error", "insufficient_scope",
                           f"this key's scopes {sorted(principal.scopes)} do not include "
                           f"{'admin' if family == 'admin' else family + ' or admin'}")
        return principal

    async def _principal(self, auth: Authenticator, headers: dict[str, str],
                         family: str) -> Principal | None:
        scheme, _, secret = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return await auth.bearer(secret.strip())
        if family == "admin":
            cookie = _cookie(headers.get("cookie", ""), sessions.COOKIE)
            return await auth.session(cookie) if cookie else None
        return None

    def _check_local(self, headers: dict[str, str]) -> None:
        if "*" in self.allowed_hosts:
            return
        host = host_of(headers.get("host", ""))
        if host not in self.allowed_hosts:
            raise ApiError(421, "permission_error", "host_not_allowed",
                           f"Host {host!r} is not served: without keys this gateway answers "
                           "only INFERQ_GATEWAY_ALLOWED_HOSTS")
        origin = headers.get("origin")
        if origin is not None and origin != "null":
            origin_host = host_of(origin.partition("://")[2].partition("/")[0])
            if origin_host not in self.allowed_hosts:
                raise ApiError(403, "permission_error", "cross_origin",
                               f"Origin {origin!r} is not allowed")

    def _limit(self, path: str, method: str) -> int:
        if method == "POST" and path == "/v1/files":
            return self.max_file
        if path.startswith("/dashboard"):
            return FORM_LIMIT
        return self.max_body


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    wanted = {b"authorization", b"content-length", b"host", b"origin", b"sec-fetch-site",
              b"cookie"}
    return {name.decode(): value.decode("latin-1") for name, value in raw if name in wanted}


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _bounded(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message

    return bounded


def _too_large(limit: int) -> Any:
    return error_response(ApiError(413, INVALID, "payload_too_large",
                                   f"the request body is larger than the limit of {limit} "
                                   f"bytes ({limit / MB:g} MiB)",
                                   headers={"Connection": "close"}))


def _with_security_headers(send: Send) -> Send:
    async def secured(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
        await send(message)

    return secured
