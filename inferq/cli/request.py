"""``inferq request ID``: one request's state, attempts, owner, timings (Redis clock), error,
trace id (when it carries a trace context) and the head of its result, found in any known
queue (or ``--queue``)."""

from __future__ import annotations

import argparse
import json

from inferq import plans
from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.cli.queue import parse_queue
from inferq.connection import sync_client
from inferq.lookup import Lookup, find
from inferq.producer.options import ClientOptions
from inferq.protocol.keys import DEFAULT_NAMESPACE, QueueKeys
from inferq.stats import known_queues


def add_parser(sub: Subcommands) -> None:
    r = sub.add_parser("request", help="one request: state, attempts, owner, timings, error",
                       description=__doc__)
    add_connection_options(r)
    r.add_argument("id", metavar="ID", help="the request id")
    r.add_argument("--queue", metavar="TASK:MODEL", default=None,
                   help="look only in this queue (default: every known queue)")
    r.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="key prefix of the queues")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(run=run)


def _ms(start: int | None, end: int | None) -> str:
    return "-" if start is None or end is None else f"{end - start} ms"


def format_lookup(found: Lookup) -> str:
    info = found.info
    lines = [f"request {info.id} in {found.queue}"
             + (f" (shard {found.shard})" if found.shard else ""),
             f"  state      {info.state.value}"
             + ("  (dead-lettered: inferq dead-letter show)" if found.dead_ms is not None
                else ""),
             f"  attempts   {info.attempts}"
             + (f" of {info.max_attempts}" if info.max_attempts is not None else ""),
             f"  owner      {info.owner or '-'}",
             f"  enqueued   {info.enqueued_ms if info.enqueued_ms is not None else '-'} "
             f"(ms, Redis clock; {_ms(info.enqueued_ms, found.now_ms)} ago)"]
    if info.claimed_ms is not None:
        lines.append(f"  started    {info.claimed_ms} "
                     f"(waited {_ms(info.enqueued_ms, info.claimed_ms)})")
    result = info.result
    if result is not None and result.ttft_ms is not None:
        lines.append(f"  first text {result.ttft_ms:.1f} ms after enqueue")
    if info.finished_ms is not None:
        lines.append(f"  finished   {info.finished_ms} "
                     f"(total {_ms(info.enqueued_ms, info.finished_ms)})")
    if info.deadline_ms is not None:
        lines.append(f"  deadline   {info.deadline_ms}")
    if found.error is not None:
        lines.append(f"  error      [{found.error[0]}] {found.error[1]}")
    if found.trace_id is not None:
        lines.append(f"  trace      {found.trace_id}")
    head = found.head()
    if head is not None:
        lines.append(f"  result     {head}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    client = sync_client(connection_from_args(args))
    try:
        queues = ([parse_queue(args.queue, args.namespace)] if args.queue else
                  [QueueKeys(q, args.namespace) for q in known_queues(client, args.namespace)])
        found = plans.run(client, find(args.id, queues,
                                       ClientOptions(namespace=args.namespace)))
        if found is None:
            where = args.queue or f"{len(queues)} known queue(s)"
            print(f"request {args.id}: unknown (not in {where}, or its result has expired)")
            return 1
        print(json.dumps(found.as_dict(), indent=2) if args.json else format_lookup(found))
        return 0
    finally:
        client.close()
