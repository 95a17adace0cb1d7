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

SPEC_KEYS = {"prompt", "id", "priority", "deadline_s", "params", "max_attempts", "tenant"}


def add_parser(sub: Subcommands) -> None:
    e = sub.add_parser(
        "enqueue", help="enqueue one prompt (or a JSON-lines file) and print the result",
        description="Queue one PROMPT (or every line of --file) on the queue TASK:MODEL and "
                    "wait for the result. Prints a short summary; --json prints the whole "
                    "result. Warns at once when no live worker serves the queue (the request "
                    "stays queued and runs when one starts).")
    add_connection_options(e)
    e.add_argument("prompt", nargs="?", help="one prompt (or use --file)")
    e.add_argument("--file", metavar="PATH",
                   help="JSON lines of prompts ('-': stdin): each a string or an object with "
                        "prompt and optional id, priority, deadline_s, params, tenant")
    e.add_argument("--out", metavar="PATH",
                   help="with --file: write one JSON result per line here (default stdout)")
    e.add_argument("--chunk", type=int, default=500, help="with --file: enqueue batch size")
    e.add_argument("--model", required=True, help="the model's name, as its worker serves it")
    e.add_argument("--task", default="embed", choices=["embed", "generate", "score"],
                   help="the queue's task")
    e.add_argument("--priority", type=int, default=0, metavar="-100..100",
                   help="higher is served first; FIFO within one priority")
    e.add_argument("--tenant", default=None, metavar="NAME",
                   help="who sends it: fair shares by cost and weight within a priority "
                        "(inferq queue set --tenant-weight); with --file, each line's "
                        "tenant wins")
    e.add_argument("--deadline-s", type=float, default=None, metavar="S",
                   help="answer 'expired' if still queued after this many seconds "
                        "(default: no deadline)")
    e.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="how long to wait for the result(s); the request stays queued after")
    e.add_argument("--no-wait", action="store_true", help="print the id and return")
    e.add_argument("--json", action="store_true",
                   help="print the whole result as JSON (default: a one-line summary)")
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
                                messages=messages, tenant=args.tenant)
        if args.no_wait:
            print(handle.id)
            return 0
        if args.stream:
            return print_stream(handle, args.timeout, chat=args.chat)
        result = handle.result(timeout=args.timeout)
        print(json.dumps(result.model_dump(mode="json", exclude_none=True)) if args.json
              else summarize(result))
        warn_empty_generation(args, result)
    return 0


def warn_empty_generation(args: argparse.Namespace, result: Result) -> None:
    """A plain prompt to an instruct model often ends at once: say why the text is empty."""
    text = result.output.get("text") if isinstance(result.output, dict) else None
    if args.task == "generate" and not args.chat and text is not None and not text.strip():
        print("inferq: warning: the model generated no text; an instruct (chat) model usually "
              "needs --chat, which sends the prompt as a user message through its chat "
              "template", file=sys.stderr)


def summarize(result: Result) -> str:
    """One or two lines for a person: the output in short, then where and how fast."""
    output = result.output
    if isinstance(output, list) and output and all(isinstance(x, int | float) for x in output):
        head = ", ".join(f"{x:+.4f}" for x in output[:4])
        what = f"embedding, {len(output)} dimensions: [{head}, ...]"
    elif isinstance(output, dict) and "text" in output:
        what = str(output["text"])
        if result.finish_reason is not None:
            what += f"\n(finish: {result.finish_reason.value})"
    else:
        what = json.dumps(output)
        what = what if len(what) <= 200 else what[:200] + "..."
    facts = [f"id {result.id}", f"worker {result.worker or '?'}"]
    if result.enqueued_ms is not None and result.started_ms is not None:
        facts.append(f"queued {result.started_ms - result.enqueued_ms} ms")
    if result.compute_ms is not None:
        facts.append(f"compute {result.compute_ms:.0f} ms")
    if result.batch_size:
        facts.append(f"batch {result.batch_size}")
    if getattr(result, "truncated", None):
        facts.append("input TRUNCATED to the model's maximum length")
    return f"{what}\n{result.status.value}: " + ", ".join(facts) + " (--json: everything)"


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


def print_stream(handle: Handle, timeout: float, chat: bool = False) -> int:
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
    if final.ok and not chat and text is not None and not text.strip():
        print("inferq: warning: the model generated no text; an instruct (chat) model usually "
              "needs --chat, which sends the prompt as a user message through its chat "
              "template", file=sys.stderr)
    summary = final.model_dump(mode="json", exclude_none=True)
    if isinstance(summary.get("output"), dict):
        summary["output"] = {k: v for k, v in summary["output"].items() if k != "token_ids"}
    print(json.dumps(summary), file=sys.stderr)
    return 0 if final.ok else 1


def read_requests(path: Path | str) -> list[dict[str, Any]]:
    """Each line: a JSON string (the prompt) or an object with ``prompt`` and optional
    ``id``, ``priority``, ``deadline_s``, ``params``, ``max_attempts``, ``tenant``. Blank
    lines skip.
    ``-`` reads standard input."""
    with contextlib.ExitStack() as stack:
        if str(path) == "-":
            path, lines = "<stdin>", sys.stdin
        else:
            try:
                lines = stack.enter_context(Path(path).open(encoding="utf-8"))
            except OSError as exc:
                raise ValidationError(f"--file {path}: {exc.strerror or exc}",
                                      field="file") from exc
        return _parse_lines(path, lines)


def _parse_lines(path: Path | str, lines: TextIO) -> list[dict[str, Any]]:
    requests = []
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
    """A progress bar on stderr (tqdm), shown only when stderr is a terminal."""

    def __init__(self, total: int, label: str, stream: TextIO = sys.stderr) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=label, unit="req", file=stream,
                        disable=not stream.isatty(), leave=True, dynamic_ncols=True)

    def show(self, done: int) -> None:
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def _open_out(path: str) -> TextIO:
    try:
        return Path(path).open("w", encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"--out {path}: {exc.strerror or exc}", field="out") from exc


def run_file(client: Client, args: argparse.Namespace) -> int:
    requests = read_requests(args.file)
    if args.out and not args.no_wait:
        _open_out(args.out).close()  # fail before queueing anything, not after
    defaults: dict[str, Any] = {"model": args.model, "task": args.task,
                                "priority": args.priority, "deadline_s": args.deadline_s,
                                "tenant": args.tenant}
    started = time.monotonic()
    handles: list[Handle] = []
    if not requests:
        raise ValidationError(f"--file {args.file}: no requests in it", field="file")
    progress = Progress(len(requests), "enqueued")
    try:
        for start in range(0, len(requests), args.chunk):
            handles += client.enqueue_many(requests[start:start + args.chunk], **defaults)
            progress.show(len(handles))
    finally:
        progress.close()
    if args.no_wait:
        for handle in handles:
            print(handle.id)
        return 0
    outcomes: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(_open_out(args.out)) if args.out else sys.stdout
        write_results(handles, out, outcomes, deadline=started + args.timeout)
    elapsed = time.monotonic() - started
    summary = ", ".join(f"{n} {status}" for status, n in sorted(outcomes.items()))
    print(f"{len(handles)} requests in {elapsed:.1f} s ({len(handles) / elapsed:.0f}/s): "
          f"{summary}", file=sys.stderr)
    return 0 if set(outcomes) <= {"ok"} else 1


def write_results(handles: list[Handle], out: TextIO, outcomes: Counter[str], *,
                  deadline: float) -> None:
    progress = Progress(len(handles), "results")
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
            progress.show(done)
    finally:
        progress.close()

