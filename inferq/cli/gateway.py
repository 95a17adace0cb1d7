"""``inferq gateway``: the HTTP gateway; its flags belong to ``inferq.gateway.__main__``."""

from __future__ import annotations

import argparse

from inferq.cli.options import Subcommands, missing_extra


def add_parser(sub: Subcommands) -> None:
    g = sub.add_parser("gateway", add_help=False,
                       help="HTTP gateway (OpenAI-compatible); needs inferq[gateway]")
    g.set_defaults(run=run, forwarded=[])


def run(args: argparse.Namespace) -> int:
    try:
        from inferq.gateway.__main__ import serve
    except ImportError as exc:
        return missing_extra("gateway", "gateway", exc)
    return serve(args.forwarded)
