"""``inferq`` command-line entry point. Each command is one module of ``inferq.cli`` that adds
its own parser; commands import their heavy parts lazily, so ``inferq stats`` never imports
torch."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import redis
from redis.exceptions import AuthenticationWrongNumberOfArgsError, NoPermissionError

from inferq.cli import convert, demo, enqueue, gateway, queue, stats, worker
from inferq.connection import describe_error, url_from_env
from inferq.errors import BackendUnavailable, InferqError
from inferq.logs import configure as configure_logging

#: In the order ``inferq --help`` lists them.
COMMANDS = (worker, stats, queue, enqueue, gateway, convert, demo)
#: Failures to reach or log in to the server; anything else keeps its traceback.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, NoPermissionError,
                     AuthenticationWrongNumberOfArgsError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferq", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("INFERQ_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-format", choices=["auto", "json", "text"],
                        default=os.environ.get("INFERQ_LOG_FORMAT", "auto"),
                        help="auto: JSON lines unless stderr is a terminal")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if "forwarded" in vars(args):
        args.forwarded = extra  # a command with a parser of its own (gateway) reads them
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    configure_logging(args.log_level, args.log_format)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except CONNECTION_ERRORS as exc:  # a one-line reason instead of a traceback
        reason = (exc.message if isinstance(exc, BackendUnavailable)
                  else describe_error(url_from_env(getattr(args, "redis_url", None)), exc))
        print(f"inferq: error [connection]: {reason}", file=sys.stderr)
    except InferqError as exc:
        print(f"inferq: error [{exc.code}]: {exc.message}", file=sys.stderr)
    return 2
