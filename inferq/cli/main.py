"""``inferq`` command-line entry point. Each command is one module of ``inferq.cli`` that adds
its own parser; commands import their heavy parts lazily, so ``inferq stats`` never imports
torch. Errors a user can fix print one line (``inferq: error [code]: ...``) and exit 2."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TextIO

import redis
from redis.exceptions import (
    AuthenticationWrongNumberOfArgsError,
    InvalidResponse,
    NoPermissionError,
)

import inferq
from inferq.cli import (
    batch,
    convert,
    dashboard,
    deadletter,
    demo,
    enqueue,
    gateway,
    keys,
    queue,
    stats,
    usage,
    worker,
)
from inferq.cli import request as request_cmd
from inferq.cli.options import HelpFormatter
from inferq.connection import describe_error, url_from_env
from inferq.errors import BackendUnavailable, InferqError
from inferq.logs import configure as configure_logging
from inferq.producer.presence import NoWorkerWarning

DESCRIPTION = """\
inferq: a durable, priority-aware inference queue on Redis.

Start a worker for a model, enqueue prompts from anywhere, watch the queue:

  inferq demo                                   everything on this machine, nothing to set up
  inferq worker --model minilm                  serve MiniLM embeddings (needs inferq[worker])
  inferq enqueue "hello" --model minilm         queue one prompt and print its result
  inferq stats                                  queue depths, in flight, workers, throughput
  inferq gateway                                OpenAI-compatible HTTP API (needs inferq[gateway])
  inferq keys create --tenant acme              an API key for a tenant of the gateway
  inferq batch submit in.jsonl --endpoint /v1/embeddings   a batch job through the gateway

Every command that talks to Redis takes --redis-url (default $INFERQ_REDIS_URL or
redis://localhost:6379/0). `inferq COMMAND --help` shows a command's options."""

#: In the order ``inferq --help`` lists them.
COMMANDS = (worker, stats, queue, enqueue, gateway, keys, usage, batch, convert, demo,
            deadletter, request_cmd, dashboard)
#: Failures to reach or log in to the server; anything else keeps its traceback.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, NoPermissionError,
                     AuthenticationWrongNumberOfArgsError, InvalidResponse)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(LOG_LEVELS)} "
                                         f"(any case), got {value!r}")
    return value.upper()


def add_logging_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--log-level``/``--log-format``: on the top parser with their defaults, and on each
    command (absent unless given), so they work before or after the command's name."""
    group = parser.add_argument_group("logging")
    level_default = os.environ.get("INFERQ_LOG_LEVEL", "INFO") if top else argparse.SUPPRESS
    format_default = os.environ.get("INFERQ_LOG_FORMAT", "auto") if top else argparse.SUPPRESS
    group.add_argument("--log-level", type=_level, default=level_default, metavar="LEVEL",
                       help=f"{', '.join(LOG_LEVELS)} (default $INFERQ_LOG_LEVEL or INFO)")
    group.add_argument("--log-format", choices=["auto", "json", "text"], default=format_default,
                       help="auto: JSON lines unless stderr is a terminal "
                            "(default $INFERQ_LOG_FORMAT or auto)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferq", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"inferq {inferq.__version__}")
    add_logging_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands")
    for command in COMMANDS:
        command.add_parser(sub)
    for name, command_parser in sub.choices.items():
        if name != "gateway":  # the gateway's own parser has its (uvicorn) --log-level
            add_logging_options(command_parser, top=False)
        if command_parser.formatter_class is argparse.HelpFormatter:
            command_parser.formatter_class = HelpFormatter
    return parser


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
    """inferq's own warnings as one line on stderr (no source line); others as Python does."""
    if issubclass(category, NoWorkerWarning):
        print(f"inferq: warning: {message}", file=file or sys.stderr, flush=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if "forwarded" in vars(args):
        args.forwarded = extra  # a command with a parser of its own (gateway) reads them
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    configure_logging(args.log_level, args.log_format)
    run: Callable[[argparse.Namespace], int] = args.run
    with warnings.catch_warnings():
        warnings.simplefilter("always", NoWorkerWarning)
        warnings.showwarning = show_warning
        try:
            return run(args)
        except CONNECTION_ERRORS as exc:  # a one-line reason instead of a traceback
            reason = (exc.message if isinstance(exc, BackendUnavailable)
                      else describe_error(url_from_env(getattr(args, "redis_url", None)), exc))
            print(f"inferq: error [connection]: {reason}", file=sys.stderr)
        except InferqError as exc:
            print(f"inferq: error [{exc.code}]: {exc.message}", file=sys.stderr)
        except KeyboardInterrupt:
            print("inferq: interrupted", file=sys.stderr)
            return 130
    return 2


