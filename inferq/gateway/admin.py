"""The operator's HTTP surface: dead letters, request lookup, the live dashboard and the
autoscaling signal. Mounted by the gateway (``create_app``) and by ``inferq dashboard``
(``inferq.gateway.opsapp``, for a setup without a gateway).

Routes (``{queue}`` is ``TASK:MODEL``):

* ``GET /admin/overview``: every queue (pending by priority, in flight, dead-lettered with
  the cap and what fell off it, throughput, queue wait p50/p99, live workers with their
  windows, desired workers, cache affinity's figures per worker and summed) and its newest
  dead letters: what the dashboard draws.
* ``GET /admin/queues/{queue}/dead-letters`` (``id``, ``error_code``, ``older_than_s``,
  ``limit``), ``GET .../dead-letters/{id}``, ``POST .../dead-letters/requeue`` and
  ``POST .../dead-letters/purge`` (a JSON body with the same filters; ``all: true`` when none).
* ``GET /admin/requests/{id}``: ``inferq request ID``.
* ``GET /autoscale`` and ``GET /autoscale/{queue}``: the desired-workers signal as JSON, for
  KEDA's ``metrics-api`` scaler (``valueLocation: desired``).
* ``GET /metrics/autoscale``: the same signal in Prometheus' text format.
* ``GET /dashboard``: the page; ``POST /dashboard/login``: its sign-in form;
  ``POST /dashboard/logout``. The page uses relative URLs, so it works behind a proxy prefix
  (``--root-path``).

Who may call them is decided by the front door (``frontdoor``) before a route runs: the
admin routes need an admin-scoped key (or the operator's token), as a bearer header or
through a dashboard session; ``/autoscale`` and ``/metrics/autoscale`` also take an
autoscale-scoped key (numbers and queue names, no prompts). Signing in to the dashboard
makes a server-side session (``tenancy.sessions``): the cookie is a random session id, never
the key (``HttpOnly``, ``SameSite=Strict``, expiring); signing out, or revoking the key, ends
it; failed sign-ins are limited per client address.

The dashboard is one static page (``dashboard.html``) that fetches ``/admin/overview`` every
second and draws it with a few lines of plain JavaScript. Why not Jinja2 + htmx: both would
be new dependencies of the gateway's install (htmx vendored, as no CDN may be reachable from
a cluster), and a JSON endpoint is what an operator's scripts want anyway; one page over the
JSON the admin API already serves needs no build step, no template engine and no Node.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from pydantic import BaseModel, Field

from inferq import autoscale, deadletters, plans, stats
from inferq.affinity_stats import AffinityFigures, queue_figures, worker_figures
from inferq.autoscale import Signal, Tracker
from inferq.deadletters import DeadLetterFilter
from inferq.gateway.authn import Authenticator
from inferq.lookup import find
from inferq.openai.errors import ApiError
from inferq.producer.aio import AsyncClient
from inferq.protocol.keys import QueueKeys, queue_name, queues_registry, requested_registry
from inferq.protocol.ops import as_str
from inferq.tenancy import apikeys, sessions
from inferq.tenancy.principal import Principal

COOKIE = sessions.COOKIE
#: Dead letters per queue in the overview.
OVERVIEW_LETTERS = 20


@dataclass
class OpsState:
    """What the routes share: the app's ``AsyncClient`` and the signal's tracker."""

    client: AsyncClient
    auth: Authenticator
    tracker: Tracker = field(default_factory=Tracker)
    #: One signal reading at a time (the tracker's readings are ordered in time).
    signal_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def ops_state(request: Request) -> OpsState:
    state: OpsState = request.app.state.ops
    return state


Ops = Annotated[OpsState, Depends(ops_state)]


def queue_keys(queue: str, state: OpsState) -> QueueKeys:
    task, sep, model = queue.partition(":")
    try:
        if not sep:
            raise ValueError(queue)
        queue_name(task, model)
    except Exception as exc:
        raise ApiError(400, "invalid_request_error", "invalid_queue",
                       f"queue must be TASK:MODEL (letters, digits, '.', '_', '-'), got "
                       f"{queue!r}", param="queue") from exc
    return QueueKeys.for_model(task, model, state.client.options.namespace)


class DeadLetterAction(BaseModel):
    """Which dead letters to requeue or purge: every given filter must hold; with none,
    ``all`` must be true."""

    ids: list[str] = Field(default_factory=list, max_length=10_000)
    error_code: str | None = None
    older_than_s: float | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, ge=1)
    all: bool = False

    def filter(self) -> DeadLetterFilter:
        flt = DeadLetterFilter(tuple(self.ids), self.error_code, self.older_than_s, self.limit)
        if not flt.narrows and not self.all:
            raise ApiError(400, "invalid_request_error", "no_filter",
                           "give ids, error_code or older_than_s, or all: true")
        return flt


api = APIRouter(tags=["admin"])
open_routes = APIRouter(tags=["admin"])


async def _run(state: OpsState, plan: plans.Plan[Any]) -> Any:
    return await plans.run_async(state.client.redis, plan)


async def _queues(state: OpsState) -> list[QueueKeys]:
    namespace = state.client.options.namespace
    pipe = state.client.redis.pipeline(transaction=False)
    pipe.smembers(queues_registry(namespace))
    pipe.smembers(requested_registry(namespace))
    served, requested = await pipe.execute()
    names = sorted({as_str(q) for q in served} | {as_str(q) for q in requested})
    return [QueueKeys(name, namespace) for name in names]


async def _signal(state: OpsState, keys: QueueKeys) -> Signal:
    async with state.signal_lock:
        signal: Signal = await _run(state, state.tracker.read(keys))
        return signal


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _figures(figures: AffinityFigures | None) -> dict[str, Any] | None:
    return None if figures is None else figures.as_dict()


def _with_affinity(windows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each worker's window, with its cache-affinity figures under ``affinity``."""
    return {worker: {**w, "affinity": _figures(worker_figures(w))}
            for worker, w in windows.items()}


@api.get("/admin/overview", summary="Every queue, its workers and its newest dead letters")
async def overview(state: Ops) -> dict[str, Any]:
    out = []
    for keys in await _queues(state):
        st = await _run(state, stats.sharded_queue_stats(keys))
        letters = await _run(state, deadletters.report(
            keys, DeadLetterFilter(limit=OVERVIEW_LETTERS)))
        signal = await _signal(state, keys)
        windows = st.windows
        p50s = [float(w["wait_p50_ms"]) for w in windows.values() if "wait_p50_ms" in w]
        p99s = [float(w["wait_p99_ms"]) for w in windows.values() if "wait_p99_ms" in w]
        out.append({
            "queue": keys.queue, "pending": st.pending,
            "pending_by_priority": {str(p): n for p, n in sorted(
                st.pending_by_priority.items(), reverse=True)},
            "inflight": st.inflight, "dead_lettered": st.dead_lettered,
            "throughput_per_s": st.throughput_per_s,
            # each worker's recent waits: the median of their p50s, the worst of their p99s
            "wait_p50_ms": _median(p50s), "wait_p99_ms": max(p99s) if p99s else None,
            "live_workers": st.live_workers, "workers": _with_affinity(windows),
            "desired_workers": signal.desired, "signal": signal.as_dict(),
            "dead_letters": letters.as_dict(),
            # latency objectives: goodput and admission's prediction error (QueueStats)
            "slo": st.as_dict()["slo"],
            # cache affinity: hit rate, tokens saved, affinity claims (None: no worker has it)
            "affinity": _figures(queue_figures(windows.values())),
        })
    return {"queues": out}


@api.get("/admin/queues/{queue}/dead-letters", summary="A queue's dead letters, newest first")
async def list_dead_letters(state: Ops, queue: str,
                            id: Annotated[list[str] | None, Query()] = None,
                            error_code: str | None = None,
                            older_than_s: Annotated[float | None, Query(ge=0)] = None,
                            limit: Annotated[int | None, Query(ge=1)] = 100) -> dict[str, Any]:
    keys = queue_keys(queue, state)
    flt = DeadLetterFilter(tuple(id or ()), error_code, older_than_s, limit)
    report: deadletters.DeadLetterReport = await _run(state, deadletters.report(keys, flt))
    return report.as_dict()


@api.get("/admin/queues/{queue}/dead-letters/{request_id}", summary="One dead letter")
async def show_dead_letter(state: Ops, queue: str, request_id: str) -> dict[str, Any]:
    keys = queue_keys(queue, state)
    letters = await _run(state, deadletters.select(keys, deadletters.ids_filter([request_id])))
    if not letters:
        raise ApiError(404, "invalid_request_error", "not_found",
                       f"no dead letter {request_id!r} in {keys.queue}")
    result: dict[str, Any] = letters[0].as_dict()
    return result


@api.post("/admin/queues/{queue}/dead-letters/{action}",
          summary="Requeue or purge dead letters (action: requeue | purge)")
async def act_on_dead_letters(state: Ops, queue: str, action: str,
                              body: Annotated[DeadLetterAction, Body()]) -> dict[str, Any]:
    keys = queue_keys(queue, state)
    if action not in ("requeue", "purge"):
        raise ApiError(404, "invalid_request_error", "not_found",
                       f"unknown action {action!r}: requeue or purge")
    plan = (deadletters.requeue if action == "requeue" else deadletters.purge)(
        keys, body.filter(), state.client.scripts)
    done: deadletters.ActionReport = await _run(state, plan)
    return done.as_dict()


@api.get("/admin/requests/{request_id}", summary="One request, in any known queue")
async def request_info(state: Ops, request_id: str) -> dict[str, Any]:
    found = await _run(state, find(request_id, await _queues(state), state.client.options))
    if found is None:
        raise ApiError(404, "invalid_request_error", "not_found",
                       f"request {request_id!r}: unknown (or its result has expired)")
    result: dict[str, Any] = found.as_dict()
    return result


@api.get("/autoscale", summary="Desired workers of every queue (KEDA metrics-api)")
async def autoscale_all(state: Ops) -> dict[str, Any]:
    signals = [await _signal(state, keys) for keys in await _queues(state)]
    return {"queues": {s.queue: s.as_dict() for s in signals}}


@api.get("/autoscale/{queue}", summary="Desired workers of one queue (KEDA metrics-api)")
async def autoscale_one(state: Ops, queue: str) -> dict[str, Any]:
    return (await _signal(state, queue_keys(queue, state))).as_dict()


@open_routes.get("/metrics/autoscale", response_class=PlainTextResponse,
                 summary="inferq_workers_desired{queue} in Prometheus' text format")
async def autoscale_metrics(state: Ops) -> PlainTextResponse:
    signals = [await _signal(state, keys) for keys in await _queues(state)]
    return PlainTextResponse(autoscale.prometheus_text(signals),
                             media_type="text/plain; version=0.0.4")


def _page(name: str) -> str:
    return (resources.files("inferq.gateway") / name).read_text(encoding="utf-8")


_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


def _csp(page: str) -> str:
    """A Content-Security-Policy that admits exactly the page's own inline script and style
    (by hash) and nothing from elsewhere."""
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for kind, body in _INLINE.findall(page):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[kind].append(f"'sha256-{digest}'")
    return ("default-src 'none'; connect-src 'self'; img-src 'self'; form-action 'self'; "
            "base-uri 'none'; frame-ancestors 'none'; "
            f"script-src {' '.join(hashes['script']) or chr(39) + 'none' + chr(39)}; "
            f"style-src {' '.join(hashes['style']) or chr(39) + 'none' + chr(39)}")


def _html(page: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(page, status_code=status_code, headers={"Content-Security-Policy":
                                                                _csp(page)})


def _login(message: str = "") -> str:
    return _page("dashboard_login.html").replace("{{message}}", message)


async def _signed_in(request: Request, state: OpsState) -> Principal | None:
    if await state.auth.is_open():
        return Principal.operator()
    cookie = request.cookies.get(COOKIE)
    principal = await state.auth.session(cookie) if cookie else None
    return principal if principal is not None and principal.admits("admin") else None


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


@open_routes.get("/dashboard", response_class=HTMLResponse, summary="The live dashboard")
async def dashboard(request: Request, state: Ops) -> HTMLResponse:
    if await _signed_in(request, state) is None:
        return _html(_login())
    return _html(_page("dashboard.html"))


@open_routes.post("/dashboard/login", response_class=HTMLResponse, include_in_schema=False)
async def login(request: Request, state: Ops) -> Any:
    """Signs in with an admin-scoped key (or the operator's token): a session, not a cookie
    holding the key."""
    names, client = state.auth.names, _client(request)
    redis = state.client.redis
    if await plans.run_async(redis, sessions.blocked_plan(names, client)):
        return _html(_login("too many failed sign-ins: try again later"), 429)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    secret = (form.get("token") or [""])[0].strip()
    principal = await state.auth.bearer(secret)
    if principal is None or not principal.admits("admin"):
        await plans.run_async(redis, sessions.failed_plan(names, client))
        return _html(_login("wrong key, or not an admin key"), 401)
    cookie = sessions.new_cookie()
    holder = sessions.OPERATOR if principal.key_id is None else apikeys.digest(secret)
    await plans.run_async(redis, sessions.create_plan(names, cookie, holder))
    response = RedirectResponse(f"{request.scope.get('root_path', '')}/dashboard",
                                status_code=303)
    response.set_cookie(COOKIE, cookie, max_age=sessions.TTL_S, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@open_routes.post("/dashboard/logout", include_in_schema=False)
async def logout(request: Request, state: Ops) -> RedirectResponse:
    cookie = request.cookies.get(COOKIE)
    if cookie:
        await plans.run_async(state.client.redis, sessions.delete_plan(state.auth.names, cookie))
        state.auth.forget_session(cookie)
    response = RedirectResponse(f"{request.scope.get('root_path', '')}/dashboard",
                                status_code=303)
    response.delete_cookie(COOKIE, httponly=True, samesite="strict")
    return response
