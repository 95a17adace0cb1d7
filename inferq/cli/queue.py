"""``inferq queue set|show TASK:MODEL``: a queue's settings, stored in Redis (its ``config``
hash) so that every producer and worker agrees on them without a flag to keep in step.

* ``--shards S`` splits the queue over S shards (each with its own hash tag, so on a Redis
  Cluster they can sit on different masters). Producers pick it up within a second
  (``ClientOptions.settings_ttl_s``); workers claim from every shard the queue has ever had
  (``shards_seen``), so lowering S loses nothing.
* ``--max-depth N`` is the pending depth at which the queue sheds load (split evenly over the
  shards; the priority shares of ``Shedding`` apply); ``0`` is unbounded; ``--no-max-depth``
  removes it, so each producer's own ``max_queue_depth`` applies again.
* ``--tenant-weight NAME=W`` (repeatable) sets a tenant's fair-share weight within every
  priority (``--default-weight W``: every tenant not named, and requests without a tenant;
  default 1); ``--tenant-max-depth NAME=N`` refuses that tenant's new requests
  (``QueueFull``) once N of them are pending (0 removes the limit); ``--remove-tenant NAME``
  drops both. New requests use them within a second; nothing restarts.
* ``--target-wait-ms MS`` is the queue wait the autoscaling signal (``inferq_workers_desired``)
  keeps under; ``--scale-to-zero-after MINUTES`` lets it drop to 0 workers after that long
  idle (defaults: 1000 ms and 5 minutes).
* ``--order fair|deadline``: inside a priority, ``fair`` (default) serves tenants' fair
  shares; ``deadline`` serves requests with a latency objective (``ttft_slo_ms``) earliest
  deadline first, then those without one in fair order. ``--admission off|predicted``:
  ``predicted`` refuses at enqueue a request whose objective the predicted wait passes
  (``WouldMissSlo``; 429 at the gateway). ``--max-queued-tokens N`` refuses a request
  (``QueuedTokensFull``; 429) when its priority band's estimated tokens pending plus its own
  would pass N (split evenly over the shards; 0 removes the bound). See
  docs/guides/latency-objectives.md.
* ``--affinity off|prefix|session``: a generate worker's claim prefers, inside the head's
  priority band, the requests whose prompt prefix (or session) its engine holds in its prefix
  cache; ``--affinity-max-wait-ms MS`` bounds how much longer any request waits for that
  (default 500). See docs/guides/cache-affinity.md.
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
    ADMISSIONS,
    AFFINITIES,
    ORDERS,
    SET_SETTINGS,
    SET_TENANTS,
    QueueSettings,
    pairs,
    settings_call,
    settings_from_hash,
    tenants_call,
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
    change.add_argument("--tenant-weight", action="append", default=[], metavar="NAME=W",
                        type=_pair, help="a tenant's fair-share weight (repeatable)")
    change.add_argument("--default-weight", type=int, default=None, metavar="W",
                        help="the weight of tenants not named, and of requests without one")
    change.add_argument("--tenant-max-depth", action="append", default=[], metavar="NAME=N",
                        type=_pair, help="refuse a tenant's requests once N are pending "
                                         "(0 removes the limit; repeatable)")
    change.add_argument("--remove-tenant", action="append", default=[], metavar="NAME",
                        help="drop a tenant's weight and depth limit (repeatable)")
    change.add_argument("--target-wait-ms", type=int, default=None, metavar="MS",
                        help="queue wait the autoscaling signal keeps under")
    change.add_argument("--scale-to-zero-after", type=float, default=None, metavar="MINUTES",
                        help="the autoscaling signal drops to 0 after this long idle")
    change.add_argument("--order", choices=ORDERS, default=None,
                        help="order inside a priority: fair shares, or earliest objective "
                             "(ttft_slo_ms) first")
    change.add_argument("--admission", choices=ADMISSIONS, default=None,
                        help="predicted: refuse requests whose objective the predicted wait "
                             "passes")
    change.add_argument("--max-queued-tokens", type=int, default=None, metavar="N",
                        help="refuse requests once a priority band's estimated tokens pending "
                             "would pass N (0: no bound)")
    change.add_argument("--affinity", choices=AFFINITIES, default=None,
                        help="generate claims prefer the requests whose prefix (or session) "
                             "the worker's cache holds")
    change.add_argument("--affinity-max-wait-ms", type=int, default=None, metavar="MS",
                        help="how much longer a request may wait for affinity (default 500)")
    q.set_defaults(run=run)


def _pair(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=INTEGER, got {text!r}") from None


def parse_queue(text: str, namespace: str) -> QueueKeys:
    task, sep, model = text.partition(":")
    if not sep:
        raise ValidationError(f"queue must be TASK:MODEL, e.g. embed:minilm, got {text!r}")
    queue_name(task, model)  # validates both names
    return QueueKeys.for_model(task, model, namespace)


def format_settings(keys: QueueKeys, settings: QueueSettings) -> str:
    depth = "producers' own max_queue_depth" if settings.max_depth is None else (
        "unbounded" if settings.max_depth == 0 else str(settings.max_depth))
    lines = [f"queue {keys.queue}", f"  shards {settings.shards} (workers serve "
             f"{settings.claim_shards}: every shard it has had)", f"  max depth {depth}",
             f"  target wait {settings.target_wait_ms or 'default (1000)'} ms, scale to zero "
             f"after {settings.scale_to_zero_after_s or 'default (300)'} s idle",
             f"  default weight {settings.default_weight}",
             f"  order {settings.order}, admission {settings.admission}",
             f"  max queued tokens {settings.max_queued_tokens or 'unbounded'} per band",
             f"  affinity {settings.affinity}, max wait {settings.affinity_max_wait_ms} ms"]
    limits = dict(settings.tenant_max_depth)
    for tenant in sorted(settings.tenants):
        limit = limits.get(tenant)
        lines.append(f"  tenant {tenant}: weight {settings.weight(tenant)}"
                     + ("" if limit is None else f", max depth {limit}"))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    keys = parse_queue(args.queue, args.namespace)
    client = sync_client(connection_from_args(args))
    try:
        if args.action == "set":
            max_depth: int | Literal["keep"] | None = (
                None if args.no_max_depth else "keep" if args.max_depth is None
                else args.max_depth)
            idle = args.scale_to_zero_after
            tenants = (args.tenant_weight or args.default_weight is not None
                       or args.tenant_max_depth or args.remove_tenant)
            if args.shards is None and max_depth == "keep" and (
                    args.target_wait_ms is None and idle is None and not tenants
                    and args.order is None and args.admission is None
                    and args.max_queued_tokens is None and args.affinity is None
                    and args.affinity_max_wait_ms is None):
                raise ValidationError("nothing to set: give --shards, --max-depth, "
                                      "--no-max-depth, --target-wait-ms, "
                                      "--scale-to-zero-after, --order, --admission, "
                                      "--max-queued-tokens, --affinity, --affinity-max-wait-ms "
                                      "or a tenant option")
            if idle is not None and not idle * 60 >= 1:
                raise ValidationError(f"--scale-to-zero-after must be >= 1 s, got {idle} min")
            tenant_keys, tenant_args = tenants_call(
                keys.config, weights=dict(args.tenant_weight),
                default_weight=args.default_weight,
                max_depths=dict(args.tenant_max_depth), remove=tuple(args.remove_tenant))
            if tenant_args:
                client.register_script(SET_TENANTS)(keys=tenant_keys, args=tenant_args)
            call_keys, call_args = settings_call(
                keys.config, args.shards, max_depth, target_wait_ms=args.target_wait_ms,
                scale_to_zero_after_s=None if idle is None else round(idle * 60),
                order=args.order, admission=args.admission,
                max_queued_tokens=args.max_queued_tokens, affinity=args.affinity,
                affinity_max_wait_ms=args.affinity_max_wait_ms)
            raw = pairs(client.register_script(SET_SETTINGS)(keys=call_keys, args=call_args))
            # listed for ``inferq stats`` before any worker serves it
            client.sadd(queues_registry(args.namespace), keys.queue)
        else:
            raw = client.hgetall(keys.config)
        settings = settings_from_hash(raw)
        if args.json:
            stored = {k: v for k, v in asdict(settings).items() if k != "service_rate"}
            print(json.dumps({"queue": keys.queue, **stored,
                              "tenant_weights": dict(settings.tenant_weights),
                              "tenant_max_depth": dict(settings.tenant_max_depth),
                              "claim_shards": settings.claim_shards}))
        else:
            print(format_settings(keys, settings))
        return 0
    finally:
        client.close()
