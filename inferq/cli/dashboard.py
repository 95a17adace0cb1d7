"""``inferq dashboard``: the live dashboard, the dead-letter admin API and the autoscaling
signal over HTTP, without a gateway (the gateway serves the same at ``/dashboard``). Needs
``inferq[gateway]``. The token comes from ``--token`` or ``$INFERQ_GATEWAY_TOKEN``; without
one, anyone who reaches the port may requeue and purge: bind to 127.0.0.1 (the default)."""

from __future__ import annotations

import argparse
import os
import sys

from inferq.cli.options import (
    Subcommands,
    add_connection_options,
    connection_from_args,
    missing_extra,
)
from inferq.protocol.keys import DEFAULT_NAMESPACE


def add_parser(sub: Subcommands) -> None:
    d = sub.add_parser("dashboard", help="live dashboard, dead letters and autoscaling signal "
                                         "over HTTP (needs inferq[gateway])",
                       description=__doc__)
    add_connection_options(d)
    d.add_argument("--host", default="127.0.0.1", help="address to listen on")
    d.add_argument("--port", type=int, default=8090, help="port to listen on")
    d.add_argument("--token", default=None,
                   help="token for the page and the API (default $INFERQ_GATEWAY_TOKEN)")
    d.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="key prefix of the queues")
    d.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from inferq.gateway.opsapp import create_ops_app
    except ImportError as exc:
        return missing_extra("dashboard", "gateway", exc)
    token = args.token or os.environ.get("INFERQ_GATEWAY_TOKEN") or None
    app = create_ops_app(connection_from_args(args), token=token, namespace=args.namespace)
    print(f"inferq dashboard: http://{args.host}:{args.port}/dashboard "
          f"(auth {'token' if token else 'OFF'})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
