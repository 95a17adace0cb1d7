"""``inferq queue set|show TASK:MODEL``: a queue's settings, stored in Redis (its ``config``
hash) so that every producer and worker agrees on them without a flag to keep in step.

* ``--shards S`` splits the queue over S shards (each with its own hash tag, so on a Redis
  Cluster they can sit on different masters). Producers pick it up within a second
  (``ClientOptions.settings_ttl_s``); workers claim from every shard the queue has ever had
  (``shards_seen``), so lowering S loses nothing.
* ``--max-depth N`` is the pending depth at which the queue sheds load (split evenly over the
  shards; the priority shares of ``Shedding`` apply); ``0`` is unbounded; ``--no-max-depth``
  removes it, so each producer's own ``max_queue_depth`` applies again.
* ``--target-wait-ms MS`` is the queue wait the autoscaling signal (``inferq_workers_desired``)
  keeps under; ``--scale-to-zero-after MINUTES`` lets it drop to 0 workers after that long
  idle (defaults: 1000 ms and 5 minutes).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Literal

from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.connection import sync_client
from inferq.errors import ValidationError
from inferq.protocol.keys import DEFAULT_NAMESPACE, QueueKeys, queue_name, queues_registry
from inferq.protocol.settings import (
    SET_SETTINGS,
    QueueSettings,
    pairs,
    settings_call,
    settings_from_hash,
)


def add_parser(sub: Subcommands) -> None:
    q = sub.add_parser("queue", help="show or set a queue's settings (shards, depth limit)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = q.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="print a queue's settings")
    change = actions.add_parser("set", help="change a queue's settings")
    for parser in (show, change):
        add_connection_options(parser)
        parser.add_argument("queue", metavar="TASK:MODEL", help="e.g. embed:minilm")
        parser.add_argument("--namespace", default=DEFAULT_NAMESPACE)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    change.add_argument("--shards", type=int, default=None,
                        help="spread new requests over this many shards (1..1024)")
    depth = change.add_mutually_exclusive_group()
    depth.add_argument("--max-depth", type=int, default=None,
                       help="pending depth at which the queue sheds load (0: unbounded)")
    depth.add_argument("--no-max-depth", action="store_true",
                       help="remove the queue's depth limit (producers' own applies)")
    change.add_argument("--target-wait-ms", type=int, default=None, metavar="MS",
                        help="queue wait the autoscaling signal keeps under")
    change.add_argument("--scale-to-zero-after", type=float, default=None, metavar="MINUTES",
                        help="the autoscaling signal drops to 0 after this long idle")
    q.set_defaults(run=run)


def parse_queue(text: str, namespace: str) -> QueueKeys:
    task, sep, model = text.partition(":")
    if not sep:
        raise ValidationError(f"queue must be TASK:MODEL, e.g. embed:minilm, got {text!r}")
    queue_name(task, model)  # validates both names
    return QueueKeys.for_model(task, model, namespace)


def format_settings(keys: QueueKeys, settings: QueueSettings) -> str:
    depth = "producers' own max_queue_depth" if settings.max_depth is None else (
        "unbounded" if settings.max_depth == 0 else str(settings.max_depth))
    return (f"queue {keys.queue}\n  shards {settings.shards} (workers serve "
            f"{settings.claim_shards}: every shard it has had)\n  max depth {depth}\n"
            f"  target wait {settings.target_wait_ms or 'default (1000)'} ms, scale to zero "
            f"after {settings.scale_to_zero_after_s or 'default (300)'} s idle")


def run(args: argparse.Namespace) -> int:
    keys = parse_queue(args.queue, args.namespace)
    client = sync_client(connection_from_args(args))
    try:
        if args.action == "set":
            max_depth: int | Literal["keep"] | None = (
                None if args.no_max_depth else "keep" if args.max_depth is None
                else args.max_depth)
            idle = args.scale_to_zero_after
            if args.shards is None and max_depth == "keep" and (
                    args.target_wait_ms is None and idle is None):
                raise ValidationError("nothing to set: give --shards, --max-depth, "
                                      "--no-max-depth, --target-wait-ms or "
                                      "--scale-to-zero-after")
            if idle is not None and not idle * 60 >= 1:
                raise ValidationError(f"--scale-to-zero-after must be >= 1 s, got {idle} min")
            call_keys, call_args = settings_call(
                keys.config, args.shards, max_depth, target_wait_ms=args.target_wait_ms,
                scale_to_zero_after_s=None if idle is None else round(idle * 60))
            raw = pairs(client.register_script(SET_SETTINGS)(keys=call_keys, args=call_args))
            # listed for ``inferq stats`` before any worker serves it
            client.sadd(queues_registry(args.namespace), keys.queue)
        else:
            raw = client.hgetall(keys.config)
        settings = settings_from_hash(raw)
        if args.json:
            print(json.dumps({"queue": keys.queue, **asdict(settings),
                              "claim_shards": settings.claim_shards}))
        else:
            print(format_settings(keys, settings))
        return 0
    finally:
        client.close()
