"""``inferq dead-letter list|show|requeue|purge TASK:MODEL``: a queue's dead letters.

A request that used all its attempts is dead-lettered (the queue keeps the newest ones, up to
the workers' ``--dead-letter-cap``; what falls off is counted). ``list`` shows them, newest
first; ``show`` one in full; ``requeue`` puts them back in the queue (same id, priority and
tenant, attempts reset); ``purge`` deletes them. Filters: ``--id`` (repeatable),
``--error-code``, ``--older-than`` (e.g. ``90s``, ``15m``, ``2h``, ``1d``) and ``--limit``.
``requeue`` and ``purge`` act on every dead letter only with ``--all``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime

from inferq import deadletters, plans
from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.cli.queue import parse_queue
from inferq.connection import sync_client
from inferq.deadletters import DeadLetter, DeadLetterFilter
from inferq.errors import ValidationError
from inferq.protocol import ops
from inferq.protocol.keys import DEFAULT_NAMESPACE

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
#: Seconds per unit: milliseconds, then seconds, minutes, hours and days by their letter.
_UNIT_S: dict[str | None, float] = {"ms": 0.001, None: 1.0,
                                    **dict(zip("smhd", (1.0, 60.0, 3600.0, 86400.0),
                                               strict=True))}


def duration_s(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d``, ``500ms`` as seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"a duration such as 90s, 15m, 2h or 1d, got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def add_parser(sub: Subcommands) -> None:
    d = sub.add_parser("dead-letter", help="list, show, requeue or purge a queue's dead letters",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = d.add_subparsers(dest="action", required=True)
    for name, text in (("list", "list dead letters, newest first"),
                       ("show", "show dead letters in full"),
                       ("requeue", "put dead letters back in the queue"),
                       ("purge", "delete dead letters")):
        p = actions.add_parser(name, help=text)
        add_connection_options(p)
        p.add_argument("queue", metavar="TASK:MODEL", help="e.g. embed:minilm")
        p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="key prefix of the queue")
        p.add_argument("--id", action="append", default=[], dest="ids", metavar="ID",
                       help="only this request id (repeatable)")
        p.add_argument("--error-code", default=None, metavar="CODE",
                       help="only those whose error has this code (e.g. model_error)")
        p.add_argument("--older-than", type=duration_s, default=None, metavar="DURATION",
                       help="only those dead for longer than this (90s, 15m, 2h, 1d)")
        p.add_argument("--limit", type=int, default=100 if name in ("list", "show") else None,
                       help="at most this many, newest first")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name in ("requeue", "purge"):
            p.add_argument("--all", action="store_true",
                           help="act on every dead letter when no filter is given")
    d.set_defaults(run=run)


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def format_letter(letter: DeadLetter, *, full: bool) -> str:
    head = letter.prompt_head(60 if not full else 400)
    line = (f"{letter.id}  died {_time(letter.died_ms)}  [{letter.error_code or '?'}] "
            f"{letter.error_message}  attempts {letter.attempts}"
            + (f"  priority {letter.priority}" if letter.priority is not None else ""))
    if not full:
        return line + (f"  prompt {head!r}" if head is not None else "")
    lines = [f"id            {letter.id}", f"queue         {letter.queue} (shard {letter.shard})",
             f"died          {_time(letter.died_ms)}",
             f"error         [{letter.error_code or '?'}] {letter.error_message}",
             f"attempts      {letter.attempts} of {letter.max_attempts or '?'}",
             f"priority      {letter.priority if letter.priority is not None else '?'}",
             f"enqueued      {_time(letter.enqueued_ms)}",
             f"prompt        {head!r}" if head is not None else
             "prompt        (no record kept: cannot be requeued, only purged)"]
    lines += [f"{name:<13} {value}" for name, value in sorted(letter.extra.items())]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    keys = parse_queue(args.queue, args.namespace)
    flt = DeadLetterFilter(tuple(args.ids), args.error_code, args.older_than, args.limit)
    client = sync_client(connection_from_args(args))
    try:
        if args.action in ("list", "show"):
            report = plans.run(client, deadletters.report(keys, flt))
            if args.json:
                print(json.dumps(report.as_dict(), indent=2))
                return 0
            cap = "unknown (no worker dead-lettered yet)" if report.cap is None else report.cap
            print(f"queue {keys.queue}: {report.total} dead letter(s), cap {cap}, "
                  f"{report.dropped} fell off the cap, {report.requeued} requeued, "
                  f"{report.purged} purged")
            if args.ids and not report.letters:
                print(f"no dead letter with id {', '.join(args.ids)}")
            for letter in report.letters:
                print(format_letter(letter, full=args.action == "show"))
                if args.action == "show":
                    print()
            return 0
        if not flt.narrows and not args.all:
            raise ValidationError(f"{args.action} every dead letter of {keys.queue}? "
                                  "give --all, or narrow with --id, --error-code, --older-than")
        scripts = ops.register(client)
        action = deadletters.requeue if args.action == "requeue" else deadletters.purge
        done = plans.run(client, action(keys, flt, scripts))
        if args.json:
            print(json.dumps(done.as_dict(), indent=2))
        else:
            counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(done.outcomes.items()))
            print(f"queue {keys.queue}: {args.action}: {counts or 'nothing selected'}")
            for outcome in ("absent", "live", "no_record"):
                for request_id in done.outcomes.get(outcome, []):
                    print(f"  {request_id}: {outcome}", file=sys.stderr)
        return 0
    finally:
        client.close()
