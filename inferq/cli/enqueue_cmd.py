"""``inferq enqueue``: one prompt from the shell."""

from __future__ import annotations

import argparse
import json

from inferq.cli.main import connection_from_args
from inferq.producer.client import Client


def run_enqueue(args: argparse.Namespace) -> int:
    with Client(connection_from_args(args)) as client:
        handle = client.enqueue(args.prompt, model=args.model, task=args.task,
                                priority=args.priority, deadline_s=args.deadline_s)
        if args.no_wait:
            print(handle.id)
            return 0
        result = handle.result(timeout=args.timeout)
        print(json.dumps(result.model_dump(mode="json", exclude_none=True)))
    return 0
