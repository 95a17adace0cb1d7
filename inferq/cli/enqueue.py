"""``inferq enqueue``: one prompt from the shell (``--stream`` prints a generation's text as
it comes), or a JSON-lines file in bulk."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.errors import RequestError, ResultTimeout, ValidationError
from inferq.producer.client import Client, Handle
from inferq.protocol.codec import Result

SPEC_KEYS = {"prompt", "id", "priority", "deadline_s", "params", "max_attempts"}


def add_parser(sub: Subcommands) -> None:
    e = sub.add_parser("enqueue", help="enqueue one prompt and print its result")
    add_connection_options(e)
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
    e.add_argument("--stream", action="store_true",
                   help="generate: print the text as it is produced, then the result")
    e.add_argument("--params", default=None,
                   help='JSON object of task params, e.g. \'{"max_new_tokens": 32}\'')
    e.add_argument("--chat", action="store_true",
                   help="generate: send the prompt as one user message (chat template)")
    e.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if (args.stream or args.params is not None or args.chat) and (
            args.prompt is None or args.file is not None):
        raise ValidationError("--stream, --params and --chat take one PROMPT (not --file)")
    if (args.file is None) == (args.prompt is None):
        raise ValidationError("give either a PROMPT or --file, not both or neither")
    with Client(connection_from_args(args)) as client:
        if args.file is not None:
            return run_file(client, args)
        messages = [{"role": "user", "content": args.prompt}] if args.chat else None
        handle = client.enqueue("" if messages else args.prompt, model=args.model,
                                task=args.task, priority=args.priority,
                                deadline_s=args.deadline_s, params=_params(args),
                                messages=messages)
        if args.no_wait:
            print(handle.id)
            return 0
        if args.stream:
            return print_stream(handle, args.timeout)
        result = handle.result(timeout=args.timeout)
        print(json.dumps(result.model_dump(mode="json", exclude_none=True)))
    return 0


def _params(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.params is None:
        return None
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        raise ValidationError(f"--params is not JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise ValidationError("--params must be a JSON object")
    return params


def print_stream(handle: Handle, timeout: float) -> int:
    """The text to stdout as it comes, then the result (without token ids) to stderr."""
    final: Result | None = None
    for item in handle.stream(timeout=timeout):
        if isinstance(item, Result):
            final = item
        else:
            sys.stdout.write(item)
            sys.stdout.flush()
    assert final is not None
    text = final.output.get("text") if isinstance(final.output, dict) else None
    if text and not text.endswith("\n"):
        sys.stdout.write("\n")
    summary = final.model_dump(mode="json", exclude_none=True)
    if isinstance(summary.get("output"), dict):
        summary["output"] = {k: v for k, v in summary["output"].items() if k != "token_ids"}
    print(json.dumps(summary), file=sys.stderr)
    return 0 if final.ok else 1


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

