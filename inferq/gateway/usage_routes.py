"""Billable usage over HTTP (``inferq.usage``), for the gateway to mount:

* ``GET /admin/usage`` (``tenant``, ``since``: as ``inferq usage``; ``since=all`` for the
  all-time totals): ``{"since", "until", "usage": [{tenant, task, model, requests,
  prompt_tokens, completion_tokens, total_tokens}]}``. Router ``admin_usage``: mount it with
  the admin routes' guard (the admin scope).
* ``GET /metrics/usage``: the all-time totals as Prometheus counters,
  ``inferq_tenant_requests_total{tenant,task,model}`` and
  ``inferq_tenant_tokens_total{tenant,task,model,kind}`` (kind: prompt, completion). Labels
  are bounded: ``tenant`` is a tenant with an API key, every other tenant summed as
  ``other``; without any key, the ``TOP_TENANTS`` by tokens.
  Router ``usage_metrics``: it names every tenant's usage, so the front door admits the
  admin scope only.

Both read through the app's ``OpsState`` client (``admin.Ops``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from inferq import plans
from inferq.errors import ValidationError
from inferq.gateway.admin import Ops, OpsState
from inferq.openai.errors import ApiError
from inferq.protocol.keys import TenancyKeys
from inferq.tenancy.apikeys import list_plan
from inferq.usage import UsageReport, bounded, parse_since, prometheus_text, report

admin_usage = APIRouter(tags=["admin"])
usage_metrics = APIRouter(tags=["admin"])


async def _report(state: OpsState, *, since_ms: int | None = None, all_time: bool = False,
                  tenant: str | None = None) -> UsageReport:
    got: UsageReport = await plans.run_async(state.client.redis, report(
        since_ms=since_ms, all_time=all_time, tenant=tenant,
        namespace=state.client.options.namespace))
    return got


@admin_usage.get("/admin/usage", summary="Billable requests and tokens per tenant and model")
async def usage(state: Ops,
                tenant: Annotated[str | None, Query(description="only this tenant")] = None,
                since: Annotated[str | None, Query(description="a duration back (30m, 24h, "
                                                   "7d), an ISO date or time, or 'all' "
                                                   "(default: 30 days)")] = None
                ) -> dict[str, Any]:
    since_ms = None
    if since is not None and since != "all":
        try:
            since_ms = parse_since(since, int(time.time() * 1000))
        except ValidationError as exc:
            raise ApiError(400, "invalid_request_error", "invalid_since", exc.message,
                           param="since") from exc
    got = await _report(state, since_ms=since_ms, all_time=since == "all", tenant=tenant)
    return got.as_dict()


@usage_metrics.get("/metrics/usage", response_class=PlainTextResponse,
                   summary="Per-tenant usage counters in Prometheus' text format")
async def metrics(state: Ops) -> PlainTextResponse:
    got = await _report(state, all_time=True)
    keys = await plans.run_async(state.client.redis,
                                 list_plan(TenancyKeys(state.client.options.namespace)))
    tenants = {k.tenant for k in keys} or None
    return PlainTextResponse(prometheus_text(bounded(got.rows, tenants)),
                             media_type="text/plain; version=0.0.4")
