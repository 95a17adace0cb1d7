"""``python -m inferq.gateway --host 127.0.0.1 --port 8000``: serve the gateway with uvicorn.

Settings come from the environment (see ``inferq.gateway.settings``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import uvicorn
from pydantic import ValidationError as PydanticValidationError

from inferq.connection import URL_ENV, ConnectionSettings
from inferq.errors import ConfigError
from inferq.gateway import settings as settings_module
from inferq.gateway.app import create_app
from inferq.gateway.settings import GatewaySettings


def settings_help() -> str:
    """The settings table of ``inferq.gateway.settings``, as plain text for ``--help``."""
    doc = settings_module.__doc__ or ""
    rows = []
    for line in doc.splitlines():
        cells = [c.strip().replace("``", "") for c in line.strip().strip("|").split("|")]
        if line.startswith("| ``") and len(cells) == 3:
            rows.append(f"  {cells[0]:<46} {cells[1]:<26} {cells[2]}")
    return "settings (environment variables):\n" + "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferq gateway", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="inferq HTTP gateway: OpenAI-compatible /v1/embeddings, /v1/completions, "
                    "/v1/chat/completions and /v1/models, inferq's /v1/requests, and "
                    "/healthz, /readyz. Needs inferq[gateway].",
        epilog=settings_help())
    parser.add_argument("--redis-url", default=None, metavar="URL",
                        help=f"the queue's Redis (default ${URL_ENV} or redis://localhost:6379/0)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on "
                        "(default: 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument("--log-level", default="info", type=str.lower,
                        choices=["critical", "error", "warning", "info", "debug"],
                        help="default: info")
    parser.add_argument("--root-path", default="", help="when served behind a path prefix")
    parser.add_argument("--workers", type=_positive, default=1,
                        help="gateway processes sharing the port (uvicorn workers, each with "
                             "its own event loop and Redis pool); use more than 1 when one "
                             "gateway process is CPU-bound (default 1)")
    return parser


def serve(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # As the ``inferq`` CLI logs; uvicorn configures its own loggers on top.
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.redis_url is not None:
            ConnectionSettings(args.redis_url)  # a bad port or scheme: one line, now
            os.environ[URL_ENV] = args.redis_url
        settings = GatewaySettings.from_env()
    except (ConfigError, PydanticValidationError) as exc:
        print(f"inferq gateway: invalid settings: {exc}", file=sys.stderr)
        return 2
    if args.workers == 1:
        uvicorn.run(create_app(settings), host=args.host, port=args.port,
                    log_level=args.log_level, root_path=args.root_path)
        return 0
    # Several processes: uvicorn imports the factory in each (settings from the environment,
    # checked once above), and a supervisor restarts a worker process that dies.
    uvicorn.run("inferq.gateway.app:create_app", factory=True, workers=args.workers,
                host=args.host, port=args.port, log_level=args.log_level,
                root_path=args.root_path)
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(serve())
