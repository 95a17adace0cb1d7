"""``inferq batch submit|status|list|cancel|download``: batch jobs through a gateway's Batches
API (the same files and batches the ``openai`` client sees).

  inferq batch submit FILE.jsonl --endpoint /v1/embeddings    upload, create, show progress
                                                             until done, download the results
  inferq batch status BATCH_ID          one batch (--json: the whole object)
  inferq batch list                     the latest batches
  inferq batch cancel BATCH_ID          withdraw its waiting lines; running ones finish
  inferq batch download BATCH_ID        its output (and error) file

The gateway is --url (default $INFERQ_API_URL or http://localhost:8000), with the bearer token
--token (default $INFERQ_API_TOKEN)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from inferq.cli.batch_api import URL_ENV, ApiFailed, BatchApi
from inferq.cli.options import Subcommands

ENDPOINTS = ("/v1/embeddings", "/v1/chat/completions", "/v1/completions")
TERMINAL = ("completed", "failed", "expired", "cancelled")


def add_parser(sub: Subcommands) -> None:
    b = sub.add_parser("batch", help="batch jobs through the gateway's Batches API",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = b.add_subparsers(dest="action", required=True)
    submit = actions.add_parser("submit", help="upload a JSONL file, run it, download results")
    submit.add_argument("file", type=Path, metavar="FILE.jsonl")
    submit.add_argument("--endpoint", required=True, choices=ENDPOINTS)
    submit.add_argument("--window", default="24h", help="completion window")
    submit.add_argument("--priority", type=int, default=None,
                        help="the lines' priority (default: the gateway's batch priority)")
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--output", type=Path, default=None,
                        help="where the output goes (default FILE.output.jsonl; errors go to "
                             "FILE.errors.jsonl)")
    submit.add_argument("--no-wait", action="store_true", help="print the batch id and exit")
    submit.add_argument("--poll-s", type=float, default=0.5, help="progress refresh period")
    status = actions.add_parser("status", help="a batch's status and progress")
    status.add_argument("batch_id")
    status.add_argument("--json", action="store_true", help="the whole batch object")
    listing = actions.add_parser("list", help="the latest batches")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--json", action="store_true")
    cancel = actions.add_parser("cancel", help="cancel a batch")
    cancel.add_argument("batch_id")
    download = actions.add_parser("download", help="download a batch's output and errors")
    download.add_argument("batch_id")
    download.add_argument("--output", type=Path, default=None,
                          help="default BATCH_ID.output.jsonl (errors: BATCH_ID.errors.jsonl)")
    for parser in (submit, status, listing, cancel, download):
        parser.add_argument("--url", default=None, help=f"the gateway (default ${URL_ENV} or "
                                                        "http://localhost:8000)")
        parser.add_argument("--token", default=None, help="bearer token (default "
                                                          "$INFERQ_API_TOKEN)")
    b.set_defaults(run=run)


def summary(batch: dict[str, Any]) -> str:
    counts = batch["request_counts"]
    return (f"{batch['id']} {batch['status']}: {counts['completed']} completed, "
            f"{counts['failed']} failed of {counts['total']}")


def error_path(output: Path) -> Path:
    name = output.name.removesuffix(".jsonl").removesuffix(".output")
    return output.with_name(f"{name}.errors.jsonl")


def fetch_results(api: BatchApi, batch: dict[str, Any], output: Path) -> None:
    if batch.get("output_file_id"):
        size = api.download(batch["output_file_id"], output)
        print(f"output: {output} ({size} bytes)")
    if batch.get("error_file_id"):
        errors = error_path(output)
        size = api.download(batch["error_file_id"], errors)
        print(f"errors: {errors} ({size} bytes)")


def follow(api: BatchApi, batch: dict[str, Any], poll_s: float) -> dict[str, Any]:
    """Refresh the batch until it ends, with a progress bar (lines finished of total)."""
    from tqdm import tqdm

    total = batch["request_counts"]["total"]
    with tqdm(total=total, unit="line", desc=batch["id"], file=sys.stderr,
              disable=None) as bar:
        while batch["status"] not in TERMINAL:
            time.sleep(poll_s)
            batch = api.batch(batch["id"])
            counts = batch["request_counts"]
            bar.set_postfix_str(batch["status"])
            bar.update(counts["completed"] + counts["failed"] - bar.n)
    return batch


def submit(api: BatchApi, args: argparse.Namespace) -> int:
    metadata = dict(item.split("=", 1) for item in args.metadata if "=" in item)
    if len(metadata) != len(args.metadata):
        print("inferq: error [invalid_request]: --metadata takes KEY=VALUE", file=sys.stderr)
        return 2
    if args.priority is not None:
        metadata["priority"] = str(args.priority)
    uploaded = api.upload(args.file)
    batch = api.create(uploaded["id"], args.endpoint, args.window, metadata or None)
    print(f"batch {batch['id']} created ({batch['request_counts']['total']} lines, input "
          f"{uploaded['id']})")
    if args.no_wait:
        return 0
    batch = follow(api, batch, args.poll_s)
    print(summary(batch))
    output = args.output or args.file.with_name(
        args.file.name.removesuffix(".jsonl") + ".output.jsonl")
    fetch_results(api, batch, output)
    return 0 if batch["status"] == "completed" else 1


def run(args: argparse.Namespace) -> int:
    api = BatchApi(args.url, args.token)
    try:
        if args.action == "submit":
            return submit(api, args)
        if args.action == "status":
            batch = api.batch(args.batch_id)
            print(json.dumps(batch, indent=2) if args.json else summary(batch))
        elif args.action == "list":
            found = api.call("GET", f"/v1/batches?limit={args.limit}")["data"]
            if args.json:
                print(json.dumps(found, indent=2))
            for batch in [] if args.json else found:
                print(f"{summary(batch)}  ({batch['endpoint']}, {batch['model']})")
        elif args.action == "cancel":
            print(summary(api.call("POST", f"/v1/batches/{args.batch_id}/cancel")))
        else:
            batch = api.batch(args.batch_id)
            if batch["status"] not in TERMINAL:
                print(f"inferq: error [not_ready]: {summary(batch)}: no files until it ends",
                      file=sys.stderr)
                return 2
            fetch_results(api, batch, args.output or Path(f"{args.batch_id}.output.jsonl"))
        return 0
    except ApiFailed as exc:
        print(f"inferq: error [{exc.code}]: {exc.message}", file=sys.stderr)
        return 2
