"""``inferq`` command-line entry point. Subcommands import their heavy parts lazily, so
``inferq stats`` never imports torch."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import redis
from redis.exceptions import AuthenticationWrongNumberOfArgsError, NoPermissionError

from inferq.cli import generate_cmd
from inferq.connection import (
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    ConnectionSettings,
    describe_error,
)
from inferq.errors import InferqError
from inferq.logs import configure as configure_logging
from inferq.producer.common import DEFAULT_URL, URL_ENV

#: Failures to reach or log in to the server; anything else keeps its traceback.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, NoPermissionError,
                     AuthenticationWrongNumberOfArgsError)


def _url_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=os.environ.get(URL_ENV) or DEFAULT_URL,
                        help=f"Redis URL (default ${URL_ENV} or {DEFAULT_URL}); "
                             "redis://[[user]:password@]host:port/db, rediss:// for TLS")
    tls = parser.add_argument_group("TLS (rediss:// URLs)")
    tls.add_argument("--tls-ca", metavar="PEM", default=os.environ.get(TLS_CA_ENV) or None,
                     help=f"CA bundle that signed the server certificate (default ${TLS_CA_ENV}; "
                          "else the system CAs)")
    tls.add_argument("--tls-cert", metavar="PEM", default=os.environ.get(TLS_CERT_ENV) or None,
                     help="client certificate, for servers with tls-auth-clients "
                          f"(default ${TLS_CERT_ENV})")
    tls.add_argument("--tls-key", metavar="PEM", default=os.environ.get(TLS_KEY_ENV) or None,
                     help=f"client key, unless inside --tls-cert (default ${TLS_KEY_ENV})")


def connection_from_args(args: argparse.Namespace) -> ConnectionSettings:
    return ConnectionSettings(url=args.redis_url, ssl_ca_certs=args.tls_ca,
                              ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferq", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("INFERQ_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-format", choices=["auto", "json", "text"],
                        default=os.environ.get("INFERQ_LOG_FORMAT", "auto"),
                        help="auto: JSON lines unless stderr is a terminal")
    sub = parser.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", help="run a worker that serves one model")
    _url_arg(w)
    w.add_argument("--model", required=True,
                   help="NAME=PATH_OR_HUB_ID, or a known NAME (minilm, echo, sleep)")
    w.add_argument("--task", default="embed")
    w.add_argument("--max-batch-size", type=int, default=32)
    w.add_argument("--max-batch-tokens", type=int, default=8192,
                   help="padded-token budget per batch (0 = no budget)")
    w.add_argument("--max-wait-ms", type=float, default=20.0,
                   help="upper bound of the adaptive batch window")
    w.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    w.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"],
                   default="auto")
    w.add_argument("--lease-ms", type=int, default=30_000)
    w.add_argument("--result-ttl-s", type=float, default=3600.0)
    w.add_argument("--worker-id", default=None)
    w.add_argument("--metrics-port", type=int,
                   default=int(os.environ["INFERQ_METRICS_PORT"])
                   if os.environ.get("INFERQ_METRICS_PORT") else None,
                   help="serve Prometheus /metrics and /healthz on this port (0: any free one)")
    w.add_argument("--torch-threads", type=int, default=None,
                   help="torch intra-op threads on the CPU (default: torch's choice)")
    generate_cmd.add_worker_arguments(w)

    s = sub.add_parser("stats", help="queue depths, in flight, workers, windows, throughput")
    _url_arg(s)
    s.add_argument("--queue", action="append", help="task:model (default: every known queue)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--watch", action="store_true", help="refresh a live table")
    s.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")

    e = sub.add_parser("enqueue", help="enqueue one prompt and print its result")
    _url_arg(e)
    e.add_argument("prompt", nargs="?", help="one prompt (or use --file)")
    e.add_argument("--file", help="JSON lines of prompts: each a string or an object with "
                                  "prompt and optional id, priority, deadline_s, params")
    e.add_argument("--out", help="with --file: write one JSON result per line here")
    e.add_argument("--chunk", type=int, default=500, help="with --file: enqueue batch size")
    e.add_argument("--model", required=True)
    e.add_argument("--task", default="embed")
    e.add_argument("--priority", type=int, default=0)
    e.add_argument("--deadline-s", type=float, default=None)
    e.add_argument("--timeout", type=float, default=60.0)
    e.add_argument("--no-wait", action="store_true", help="print the id and return")
    generate_cmd.add_enqueue_arguments(e)

    g = sub.add_parser("gateway", add_help=False,
                       help="HTTP gateway (OpenAI-compatible); needs inferq[gateway]")
    g.set_defaults(gateway_args=[])

    generate_cmd.add_convert_parser(sub)

    d = sub.add_parser("demo", help="embedded default: local server + MiniLM worker + requests")
    d.add_argument("--data-dir", default=".inferq/demo")
    d.add_argument("--requests", type=int, default=48)
    d.add_argument("--model", default="minilm")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "gateway":
        args.gateway_args = extra  # --host, --port, ... belong to the gateway's own parser
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    configure_logging(args.log_level, args.log_format)
    try:
        if args.command == "worker":
            from inferq.cli.worker_cmd import run_worker
            return run_worker(args)
        if args.command == "convert-smollm2":
            return generate_cmd.run_convert(args)
        if args.command == "stats":
            from inferq.cli.stats_cmd import run_stats
            return run_stats(args)
        if args.command == "enqueue":
            if generate_cmd.wants_generation_cli(args):
                return generate_cmd.run_enqueue_generation(args)
            from inferq.cli.enqueue_cmd import run_enqueue
            return run_enqueue(args)
        if args.command == "gateway":
            try:
                from inferq.gateway.__main__ import serve
            except ImportError as exc:
                print(f"inferq gateway needs the gateway extra: pip install 'inferq[gateway]' "
                      f"({exc})", file=sys.stderr)
                return 2
            return serve(args.gateway_args)
        if args.command == "demo":
            from inferq.cli.demo_cmd import run_demo
            return run_demo(args)
    except InferqError as exc:
        print(f"inferq: error [{exc.code}]: {exc.message}", file=sys.stderr)
        return 2
    except CONNECTION_ERRORS as exc:  # a one-line reason instead of a traceback
        url = getattr(args, "redis_url", None) or os.environ.get(URL_ENV) or DEFAULT_URL
        print(f"inferq: error [connection]: {describe_error(url, exc)}", file=sys.stderr)
        return 2
    raise AssertionError(args.command)
