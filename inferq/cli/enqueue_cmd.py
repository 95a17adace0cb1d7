"""``inferq enqueue``: one prompt from the shell, or a JSON-lines file in bulk."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from inferq.cli.main import connection_from_args
from inferq.errors import RequestError, ResultTimeout, ValidationError
from inferq.producer.client import Client, Handle

SPEC_KEYS = {"prompt", "id", "priority", "deadline_s", "params", "max_attempts"}


def run_enqueue(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.prompt is None):
        raise ValidationError("give either a PROMPT or --file, not both or neither")
    with Client(connection_from_args(args)) as client:
        if args.file is not None:
            return run_file(client, args)
        handle = client.enqueue(args.prompt, model=args.model, task=args.task,
                                priority=args.priority, deadline_s=args.deadline_s)
        if args.no_wait:
            print(handle.id)
            return 0
        result = handle.result(timeout=args.timeout)
        print(json.dumps(result.model_dump(mode="json", exclude_none=True)))
    return 0


def read_requests(path: Path) -> list[dict[str, Any]]:
    """Each line: a JSON string (the prompt) or an object with ``prompt`` and optional
    ``id``, ``priority``, ``deadline_s``, ``params``, ``max_attempts``. Blank lines skip."""
    requests = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise ValidationError(f"{path}:{number}: not JSON: {exc}") from exc
            if isinstance(item, str):
                item = {"prompt": item}
            if not isinstance(item, dict) or "prompt" not in item:
                raise ValidationError(f"{path}:{number}: need a string or an object with prompt")
            unknown = set(item) - SPEC_KEYS
            if unknown:
                raise ValidationError(f"{path}:{number}: unknown field(s) {sorted(unknown)}")
            requests.append(item)
    return requests


class Progress:
    """A one-line progress bar on stderr (only when it is a terminal)."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.stream = stream
        self.live = stream.isatty()
        self.started = time.monotonic()

    def show(self, done: int, label: str) -> None:
        if not self.live:
            return
        width = 30
        filled = int(width * done / max(self.total, 1))
        rate = done / max(time.monotonic() - self.started, 1e-9)
        self.stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] "
                          f"{done}/{self.total} {rate:.0f}/s ")
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")


def run_file(client: Client, args: argparse.Namespace) -> int:
    requests = read_requests(Path(args.file))
    defaults: dict[str, Any] = {"model": args.model, "task": args.task,
                                "priority": args.priority, "deadline_s": args.deadline_s}
    started = time.monotonic()
    handles: list[Handle] = []
    progress = Progress(len(requests))
    for start in range(0, len(requests), args.chunk):
        handles += client.enqueue_many(requests[start:start + args.chunk], **defaults)
        progress.show(len(handles), "enqueued")
    progress.close()
    if args.no_wait:
        for handle in handles:
            print(handle.id)
        return 0
    outcomes: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        out = (stack.enter_context(Path(args.out).open("w", encoding="utf-8")) if args.out
               else sys.stdout)
        write_results(handles, out, outcomes, deadline=started + args.timeout)
    elapsed = time.monotonic() - started
    summary = ", ".join(f"{n} {status}" for status, n in sorted(outcomes.items()))
    print(f"{len(handles)} requests in {elapsed:.1f} s ({len(handles) / elapsed:.0f}/s): "
          f"{summary}", file=sys.stderr)
    return 0 if set(outcomes) <= {"ok"} else 1


def write_results(handles: list[Handle], out: TextIO, outcomes: Counter[str], *,
                  deadline: float) -> None:
    progress = Progress(len(handles))
    try:
        for done, handle in enumerate(handles, 1):
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                result = handle.result(timeout=remaining)
                record = result.model_dump(mode="json", exclude_none=True)
            except RequestError as exc:
                record = exc.result.model_dump(mode="json", exclude_none=True)
            except ResultTimeout:
                record = {"id": handle.id, "status": "timeout"}
            outcomes[record["status"]] += 1
            out.write(json.dumps(record) + "\n")
            progress.show(done, "results ")
    finally:
        progress.close()

