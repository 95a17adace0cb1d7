"""Redis CPU of the worker's per-window scripts: START + HEARTBEAT + COMPLETE of a window of
echo-sized requests, per request, from the server's own ``INFO cpu``.

    python benchmarks/script_cost.py                          # this checkout's scripts
    PYTHONPATH=/path/to/other/checkout python benchmarks/script_cost.py   # another one's

Not a ``Scenario``: a developer's probe to compare two versions of the scripts side by side
(run as a file, it uses whichever ``inferq`` is first on the path). A Redis server (AOF off)
is started for the run; each round enqueues and claims a window (not measured), then measures
the server CPU the three calls cost.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings

import redis

import inferq
from inferq.embedded import EmbeddedServer
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, encode_result
from inferq.protocol.keys import QueueKeys


def server_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(url: str, rounds: int, window: int) -> list[float]:
    """Server CPU µs per request of each round's START + HEARTBEAT + COMPLETE."""
    r = redis.Redis.from_url(url)
    scripts = ops.register(r)
    keys = QueueKeys.for_model("embed", "cost")
    per_request: list[float] = []
    with inferq.Client(url) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no worker serves the probe's queue
        for _ in range(rounds):
            client.enqueue_many([f"request {i} of the script cost probe" for i in range(window)],
                                model="cost")
            k, a = ops.claim_call(keys, "probe", 30_000, window, 60_000)
            claimed = ops.parse_claim(scripts["claim"](keys=k, args=a)).claimed
            leases = [(c.id, c.token) for c in claimed]
            done = [ops.Completion(c, "ok", encode_result(
                Result(id=c.id, status=Status.OK, output=[0.1] * 8, attempts=1)))
                for c in claimed]
            before = server_cpu_s(r)
            k, a = ops.start_call(keys, leases)
            scripts["start"](keys=k, args=a)
            k, a = ops.heartbeat_call(keys, "probe", 30_000, 10_000, leases)
            scripts["heartbeat"](keys=k, args=a)
            k, a = ops.complete_call(keys, 60_000, 100, done)
            scripts["complete"](keys=k, args=a)
            per_request.append((server_cpu_s(r) - before) / len(claimed) * 1e6)
    r.close()
    return per_request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--window", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(tmp, appendonly=False) as server:
        costs = measure(server.url, args.rounds, args.window)
    print(f"START + HEARTBEAT + COMPLETE, windows of {args.window}: server CPU per request "
          f"median {statistics.median(costs):.2f} us (min {min(costs):.2f}, "
          f"max {max(costs):.2f}) over {args.rounds} rounds; inferq from {inferq.__file__}")


if __name__ == "__main__":
    main()
