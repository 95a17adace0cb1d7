"""``inferq usage``: billable requests and tokens per tenant and model (``inferq.usage``)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.connection import sync_client
from inferq.plans import run as run_plan
from inferq.usage import UsageReport, parse_since, report


def add_parser(sub: Subcommands) -> None:
    s = sub.add_parser(
        "usage", help="billable requests and tokens per tenant and model",
        description="Requests and their actual prompt and completion tokens (embeddings: "
                    "input tokens, as prompt tokens) per tenant and model, counted where each "
                    "result was written, once per request, summed over every known queue and "
                    "shard. Requests sent without a tenant are not counted.")
    add_connection_options(s)
    s.add_argument("--tenant", metavar="T", default=None,
                   help="only this tenant")
    s.add_argument("--since", metavar="DURATION|ISO", default=None,
                   help="from this long ago (30m, 24h, 7d) or this ISO date or time (UTC "
                        "unless given), counted from the start of its hour (default: 30 days; "
                        "'all' for every request since the queues were created)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(run=run)


def format_report(got: UsageReport) -> str:
    if not got.rows:
        return "no usage in this period"
    header = ("tenant", "queue", "requests", "prompt", "completion", "total")
    table = [header] + [(r.tenant, r.queue, str(r.requests), str(r.prompt_tokens),
                         str(r.completion_tokens), str(r.total_tokens)) for r in got.rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    period = got.as_dict()
    lines = [f"usage since {period['since'] or 'the queues were created'} "
             f"(until {period['until']})"]
    for row in table:
        cells = [row[i].ljust(widths[i]) if i < 2 else row[i].rjust(widths[i])
                 for i in range(len(header))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    all_time = args.since == "all"
    since = None if args.since is None or all_time else parse_since(
        args.since, int(time.time() * 1000))
    client = sync_client(connection_from_args(args))
    try:
        got = run_plan(client, report(since_ms=since, all_time=all_time, tenant=args.tenant))
    finally:
        client.close()
    if args.json:
        json.dump(got.as_dict(), sys.stdout, indent=2)
        print()
    else:
        print(format_report(got))
    return 0
