"""Billable usage per tenant and model, as the complete script counted it where each final
result was written (``protocol/lua/includes/usage.lua``): requests, prompt tokens and
completion tokens (embeddings: input tokens, counted as prompt tokens).

Each queue shard keeps one hash per hour (``QueueKeys.usage(hour)``, kept
``USAGE_RETENTION_MS``) and one of all-time totals (``QueueKeys.usage_total``). A report
reads the hours of every known queue (the queue registries, no ``KEYS``) and every shard,
pipelined, and sums them; ``since`` has an hour's resolution (the hour that holds it counts
whole). Only requests with a tenant are counted (an API key's, or one a producer named):
requests without one are billable to no one, and cost the complete script nothing.

``prometheus_text`` renders the all-time totals as counters with bounded labels: ``tenant``
is one of the tenants the caller names (those with API keys), else one of the ``top``
tenants by tokens, the rest summed as ``other``; ``model`` is a served queue's model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from inferq.errors import ValidationError
from inferq.plans import Plan, call
from inferq.protocol.keys import (
    DEFAULT_NAMESPACE,
    USAGE_COUNTERS,
    QueueKeys,
    queues_registry,
    requested_registry,
)
from inferq.protocol.ops import as_str
from inferq.stats import shard_keys

HOUR_MS = 3_600_000
#: The window of a report without ``since``.
DEFAULT_SINCE_MS = 30 * 24 * HOUR_MS
#: Hash reads per round trip.
CHUNK = 1000
#: Tenants a Prometheus rendering names without a list of them; the others are ``other``.
TOP_TENANTS = 20
OTHER = "other"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_MS = dict(zip("smhdw", (1000, 60_000, HOUR_MS, 24 * HOUR_MS, 7 * 24 * HOUR_MS),
                    strict=True))


@dataclass(slots=True)
class UsageRow:
    tenant: str
    #: ``task:model``.
    queue: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def task(self) -> str:
        return self.queue.partition(":")[0]

    @property
    def model(self) -> str:
        return self.queue.partition(":")[2]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, counter: str, value: int) -> None:
        setattr(self, counter, getattr(self, counter) + value)

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "task": self.task, "model": self.model,
                "requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass(slots=True)
class UsageReport:
    #: The first hour counted (ms), and the time of the reading (Redis' clock, ms); None
    #: for all-time totals.
    since_ms: int | None
    until_ms: int
    rows: list[UsageRow] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def iso(ms: int) -> str:
            return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")

        return {"since": None if self.since_ms is None else iso(self.since_ms),
                "until": iso(self.until_ms), "usage": [r.as_dict() for r in self.rows]}


def parse_since(text: str, now_ms: int) -> int:
    """``--since``: a duration back from now (``90s``, ``30m``, ``24h``, ``7d``, ``2w``) or an
    ISO 8601 date or time (UTC unless it says otherwise); unix ms."""
    text = text.strip()
    if m := _DURATION.match(text):
        return now_ms - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValidationError(f"since: a duration (30m, 24h, 7d) or an ISO date or time, got "
                              f"{text!r}", field="since") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def known_queues(namespace: str = DEFAULT_NAMESPACE) -> Plan[list[str]]:
    served, requested = yield [call("smembers", queues_registry(namespace)),
                               call("smembers", requested_registry(namespace))]
    return sorted({as_str(q) for q in served} | {as_str(q) for q in requested})


def _redis_ms() -> Plan[int]:
    (now,) = yield [call("execute_command", "TIME")]
    return int(now[0]) * 1000 + int(now[1]) // 1000


def _add(rows: dict[tuple[str, str], UsageRow], queue: str, raw: dict[Any, Any],
         tenant: str | None) -> None:
    for name, value in raw.items():
        who, _, counter = as_str(name).rpartition("|")
        if counter not in USAGE_COUNTERS or (tenant is not None and who != tenant):
            continue
        row = rows.setdefault((who, queue), UsageRow(who, queue))
        row.add(counter, int(value))


def report(*, since_ms: int | None = None, all_time: bool = False, tenant: str | None = None,
           queues: Sequence[str] | None = None,
           namespace: str = DEFAULT_NAMESPACE) -> Plan[UsageReport]:
    """Usage per tenant and queue since ``since_ms`` (default: ``DEFAULT_SINCE_MS`` ago), or
    ``all_time`` (the totals hashes), of ``tenant`` only if given, over ``queues`` (default:
    every known queue)."""
    now = yield from _redis_ms()
    names = list(queues) if queues is not None else (yield from known_queues(namespace))
    since = None if all_time else (now - DEFAULT_SINCE_MS if since_ms is None else since_ms)
    hours = [] if since is None else list(range(since // HOUR_MS, now // HOUR_MS + 1))
    reads: list[tuple[str, str]] = []
    for name in names:
        for shard in (yield from shard_keys(QueueKeys(name, namespace))):
            reads += ([(name, shard.usage_total)] if since is None
                      else [(name, shard.usage(h)) for h in hours])
    rows: dict[tuple[str, str], UsageRow] = {}
    for start in range(0, len(reads), CHUNK):
        part = reads[start:start + CHUNK]
        replies = yield [call("hgetall", key) for _, key in part]
        for (name, _), raw in zip(part, replies, strict=True):
            _add(rows, name, raw, tenant)
    ordered = sorted(rows.values(), key=lambda r: (r.tenant, r.queue))
    first = None if since is None else (since // HOUR_MS) * HOUR_MS
    return UsageReport(first, now, ordered)


def bounded(rows: Iterable[UsageRow], tenants: Iterable[str] | None = None,
            top: int = TOP_TENANTS) -> list[UsageRow]:
    """``rows`` with at most a bounded set of tenant names: those in ``tenants`` if given,
    else the ``top`` by tokens; every other tenant's usage summed per queue as ``OTHER``."""
    rows = list(rows)
    if tenants is not None:
        keep = set(tenants)
    else:
        totals: dict[str, int] = {}
        for row in rows:
            totals[row.tenant] = totals.get(row.tenant, 0) + row.total_tokens + row.requests
        keep = set(sorted(totals, key=lambda t: (-totals[t], t))[:top])
    out: dict[tuple[str, str], UsageRow] = {}
    for row in rows:
        who = row.tenant if row.tenant in keep else OTHER
        merged = out.setdefault((who, row.queue), UsageRow(who, row.queue))
        for counter in USAGE_COUNTERS:
            merged.add(counter, getattr(row, counter))
    return sorted(out.values(), key=lambda r: (r.tenant, r.queue))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(rows: Iterable[UsageRow]) -> str:
    """All-time usage as Prometheus counters (pass ``bounded`` rows)."""
    lines = ["# HELP inferq_tenant_requests_total Requests a worker wrote a final result for.",
             "# TYPE inferq_tenant_requests_total counter"]
    tokens = ["# HELP inferq_tenant_tokens_total Tokens billed (kind: prompt, completion; "
              "embeddings count input tokens as prompt).",
              "# TYPE inferq_tenant_tokens_total counter"]
    for row in rows:
        labels = f'tenant="{_label(row.tenant)}",task="{_label(row.task)}",' \
                 f'model="{_label(row.model)}"'
        lines.append(f"inferq_tenant_requests_total{{{labels}}} {row.requests}")
        tokens.append(f'inferq_tenant_tokens_total{{{labels},kind="prompt"}} '
                      f"{row.prompt_tokens}")
        tokens.append(f'inferq_tenant_tokens_total{{{labels},kind="completion"}} '
                      f"{row.completion_tokens}")
    return "\n".join(lines + tokens) + "\n"
