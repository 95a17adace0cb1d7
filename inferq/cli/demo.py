"""``inferq demo``: the embedded default, nothing to set up by hand.

Starts a local Redis-compatible server (unless ``INFERQ_REDIS_URL`` is set), enqueues a mix
of priorities *before* any worker runs (they wait safely in Redis), starts a MiniLM worker
process, then prints every result and the worker's batch statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from inferq.cli.options import Subcommands
from inferq.cli.stats import format_stats, format_window
from inferq.connection import URL_ENV
from inferq.embedded import EmbeddedServer
from inferq.producer.client import Client
from inferq.stats import read_all, read_window

SENTENCES = [
    "A GPU worker claims requests in adaptive windows.",
    "Redis keeps every queued request durable.",
    "The cat sat on the mat.",
    "A kitten was sitting on a rug.",
    "Priority requests are served first.",
    "Inference queues batch requests to use accelerators well.",
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
]
PRIORITIES = [0, 0, 0, 5, 9]
DEMO_WORKER = "demo-worker"


def add_parser(sub: Subcommands) -> None:
    d = sub.add_parser("demo", help="embedded default: local server + MiniLM worker + requests")
    d.add_argument("--data-dir", default=".inferq/demo")
    d.add_argument("--requests", type=int, default=48)
    d.add_argument("--model", default="minilm")
    d.set_defaults(run=run)


@contextlib.contextmanager
def _server(data_dir: str) -> Iterator[str]:
    url = os.environ.get(URL_ENV)
    if url:
        print(f"using the server at ${URL_ENV}")
        yield url
        return
    with EmbeddedServer(data_dir) as server:
        print(f"started {os.path.basename(server.binary)} on {server.url} "
              f"(AOF in {data_dir})")
        yield server.url


def run(args: argparse.Namespace) -> int:
    with _server(args.data_dir) as url:
        client = Client(url)
        requests: list[dict[str, Any]] = [
            {"prompt": SENTENCES[i % len(SENTENCES)], "priority": PRIORITIES[i % len(PRIORITIES)]}
            for i in range(args.requests)
        ]
        handles = client.enqueue_many(requests, model=args.model, task="embed")
        print(f"enqueued {len(handles)} requests (priorities {sorted(set(PRIORITIES))}); "
              "starting a worker...")
        worker = subprocess.Popen(
            [sys.executable, "-m", "inferq", "--log-level", "WARNING", "worker",
             "--redis-url", url, "--model", args.model, "--max-batch-size", "16",
             "--worker-id", DEMO_WORKER],
        )
        try:
            started = time.monotonic()
            results = [h.result(timeout=300) for h in handles]
            elapsed = time.monotonic() - started
            print(f"\n{'prio':>4} {'wait ms':>8} {'batch':>5}  {'embedding[:3]':<26} text")
            order = sorted(zip(requests, results, strict=True),
                           key=lambda rr: rr[1].started_ms or 0)
            for request, result in order:
                vector = result.output
                head = ", ".join(f"{x:+.3f}" for x in vector[:3])
                print(f"{request['priority']:>4} {result.queue_wait_ms or 0:>8.0f} "
                      f"{result.batch_size or 0:>5}  [{head}]   {request['prompt'][:50]}")
            a, b = results[2].output, results[3].output
            print(f"\ncosine('{SENTENCES[2]}', '{SENTENCES[3]}') = "
                  f"{sum(x * y for x, y in zip(a, b, strict=True)):.3f}")
            print(f"{len(results)} results in {elapsed:.1f} s (including model load), "
                  f"dimension {len(results[0].output)}\n")
            print(format_stats(read_all(client.redis, [handles[0].keys.queue])))
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
        print("batch statistics of the demo worker (published as it stopped):")
        print(format_window(DEMO_WORKER, read_window(client.redis, handles[0].keys, DEMO_WORKER)))
        client.close()
    return 0
