"""``inferq keys create|list|revoke``: API keys bound to tenants, for the gateway.

``create --tenant NAME`` prints the new key's secret once (Redis keeps only its sha256); pass
it as ``Authorization: Bearer <secret>`` (the ``openai`` client's ``api_key``). Scopes:
``api`` (the inference, files and batches routes; the default), ``autoscale`` (the
``/autoscale`` signal only, for KEDA), ``admin`` (everything, every tenant's objects, the
dashboard). Ceilings: ``--max-priority`` (a request above it is a 403), and the limits a
gateway enforces in Redis: ``--requests-per-minute``, ``--tokens-per-minute``,
``--max-in-flight``, ``--max-queued-bytes``. ``revoke ID`` takes effect on every gateway within
a second. Once any key exists, a gateway without ``INFERQ_GATEWAY_TOKEN`` requires a key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime

from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.connection import sync_client
from inferq.protocol.keys import DEFAULT_NAMESPACE
from inferq.tenancy.apikeys import ApiKey, KeyStore
from inferq.tenancy.principal import SCOPES

LIMITS = ("max_priority", "requests_per_minute", "tokens_per_minute", "max_in_flight",
          "max_queued_bytes")


def add_parser(sub: Subcommands) -> None:
    k = sub.add_parser("keys", help="create, list or revoke the gateway's API keys (tenants)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = k.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a new key for a tenant (its secret, once)")
    create.add_argument("--tenant", required=True, help="the tenant the key belongs to")
    create.add_argument("--name", default="", help="a label, to tell keys apart")
    create.add_argument("--scope", action="append", choices=SCOPES, dest="scopes",
                        help="api (default), admin, autoscale; repeatable")
    create.add_argument("--max-priority", type=int, default=None, metavar="P",
                        help="the highest priority this key may ask for (403 above)")
    create.add_argument("--requests-per-minute", type=int, default=None, metavar="N")
    create.add_argument("--tokens-per-minute", type=int, default=None, metavar="N")
    create.add_argument("--max-in-flight", type=int, default=None, metavar="N",
                        help="most unfinished requests of the tenant at once")
    create.add_argument("--max-queued-bytes", type=int, default=None, metavar="BYTES",
                        help="most payload bytes the tenant may have waiting in Redis")
    create.add_argument("--secret-from-env", default=None, metavar="VAR",
                        help="register the secret in $VAR (made by the operator, e.g. "
                             "iq_$(openssl rand -hex 32)) instead of making one; a secret "
                             "registered before is left as it is (idempotent: for a Job)")
    listing = actions.add_parser("list", help="every key (never a secret)")
    listing.add_argument("--tenant", default=None, help="only this tenant's keys")
    revoke = actions.add_parser("revoke", help="refuse a key from now on (every gateway)")
    revoke.add_argument("key_id", metavar="ID", help="the key's id (inferq keys list)")
    for p in (create, listing, revoke):
        add_connection_options(p)
        p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the queues' key prefix")
        p.add_argument("--json", action="store_true", help="machine-readable output")
    k.set_defaults(run=run)


def describe(key: ApiKey) -> str:
    made = datetime.fromtimestamp(key.created_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    limits = " ".join(f"{name.replace('_', '-')}={getattr(key, name)}" for name in LIMITS
                      if getattr(key, name) is not None)
    return (f"{key.id}  tenant={key.tenant}  scopes={','.join(key.scopes)}  {key.hint}…  "
            f"created {made}" + (f"  {limits}" if limits else "")
            + (f"  name={key.name!r}" if key.name else ""))


def run(args: argparse.Namespace) -> int:
    store = KeyStore(sync_client(connection_from_args(args)), args.namespace)
    try:
        if args.action == "create":
            given = None
            if args.secret_from_env is not None:
                given = os.environ.get(args.secret_from_env)
                if not given:
                    print(f"inferq keys: ${args.secret_from_env} is not set", file=sys.stderr)
                    return 2
            made = store.create(args.tenant, scopes=args.scopes or ["api"], name=args.name,
                                secret=given, **{name: getattr(args, name) for name in LIMITS})
            shown = {} if given is not None else {"secret": made.secret}
            if args.json:
                print(json.dumps({**made.key.as_dict(), **shown}, indent=2))
            else:
                print(describe(made.key))
                if given is None:
                    print(f"secret: {made.secret}")
                    print("(shown once: Redis keeps only its hash)")
            return 0
        if args.action == "list":
            found = store.list(args.tenant)
            if args.json:
                print(json.dumps([k.as_dict() for k in found], indent=2))
            else:
                print("\n".join(describe(k) for k in found) if found else "no keys")
            return 0
        revoked = store.revoke(args.key_id)
        if args.json:
            print(json.dumps({"id": args.key_id, "revoked": revoked}))
        else:
            print(f"{args.key_id}: " + ("revoked" if revoked else "no such key"))
        return 0 if revoked else 1
    finally:
        store.redis.close()
