"""``inferq gateway``: the HTTP gateway; its flags belong to ``inferq.gateway.__main__``."""

from __future__ import annotations

import argparse
import sys

from inferq.cli.options import Subcommands


def add_parser(sub: Subcommands) -> None:
    g = sub.add_parser("gateway", add_help=False,
                       help="HTTP gateway (OpenAI-compatible); needs inferq[gateway]")
    g.set_defaults(run=run, forwarded=[])


def run(args: argparse.Namespace) -> int:
    try:
        from inferq.gateway.__main__ import serve
    except ImportError as exc:
        print(f"inferq gateway needs the gateway extra: pip install 'inferq[gateway]' ({exc})",
              file=sys.stderr)
        return 2
    return serve(args.forwarded)
