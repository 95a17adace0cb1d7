"""Two developer's probes to compare versions of inferq side by side (run as a file, each uses
whichever ``inferq`` is first on the path; not ``Scenario``s, no RESULTS.md section):

    python benchmarks/script_cost.py scripts      # server CPU of each hot script, per request
    python benchmarks/script_cost.py split        # CPU split of one end-to-end pass
    python benchmarks/script_cost.py sweep        # server CPU of one worker's reclaim sweep
    python benchmarks/script_cost.py enqueue      # the SDK's own CPU per single enqueue
    PYTHONPATH=/path/to/other/checkout python benchmarks/script_cost.py split   # another one's

``scripts``: each round enqueues a chunk of 1,024 echo-sized requests (``Client.enqueue_many``),
then claims, starts and completes it in windows of 512, reading the server's own ``INFO cpu``
around each call. ``split``: one ``inferq worker`` process (built-in echo) and this process as
the producer (``AsyncClient.enqueue_many`` in chunks of 1,000, awaiting with ``result()`` per
handle, or ``--results`` with one ``results()`` per chunk); CPU seconds of the producer, the
worker and Redis over the pass, per request, and the commands Redis ran. ``sweep``: what one
reclaim sweep (every worker runs one each lease / 8) costs the server with ``--workers``
workers registered and connected (two named connections each) and 1,000 leases in flight,
none expired: the RECLAIM call, and the ``CLIENT LIST`` before it where this checkout
notices dead workers by their connections. ``enqueue``: the producer's own CPU per
``Client.enqueue`` and ``AsyncClient.enqueue`` without the round trip: after a warm-up on the
server, the enqueue script is a stub that returns the server's reply and the settings and
presence caches never expire, so what is timed is the SDK's code (prepare, route, the
script's arguments, the reply, the handle); the best of ``--rounds`` rounds. A server
(``redis-server``, AOF off unless ``--aof``) is started for each run.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import redis

import inferq
from inferq.embedded import EmbeddedServer
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, encode_result
from inferq.protocol.keys import QueueKeys


def server_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def completion(c: ops.Claimed, body: bytes) -> ops.Completion:
    """An ok completion, in this checkout's ``ops.Completion`` (before #24 it took the id and
    token; now the claim)."""
    if "claimed" in ops.Completion.__dataclass_fields__:
        return ops.Completion(c, "ok", body)  # type: ignore[arg-type]
    return ops.Completion(c.id, c.token, "ok", body)  # type: ignore[call-arg, arg-type]


def scripts_cost(url: str, rounds: int) -> dict[str, list[float]]:
    r = redis.Redis.from_url(url)
    scripts = ops.register(r)
    keys = QueueKeys.for_model("embed", "cost")
    cost: dict[str, list[float]] = {"enqueue": [], "claim": [], "start": [], "complete": []}

    def timed(name: str, n: int, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        before = server_cpu_s(r)
        reply = call(*args, **kwargs)
        cost[name].append((server_cpu_s(r) - before) / n * 1e6)
        return reply

    with inferq.Client(url) as client:
        for k in range(rounds):
            prompts = [f"request {k}-{i} of the script cost probe" for i in range(1024)]
            timed("enqueue", 1024, client.enqueue_many, prompts, model="cost")
            for _ in range(2):
                a, b = ops.claim_call(keys, "probe", 30_000, 512, 60_000)
                claimed = ops.parse_claim(timed("claim", 512, scripts["claim"], keys=a,
                                                args=b)).claimed
                a, b = ops.start_call(keys, [(c.id, c.token) for c in claimed])
                timed("start", 512, scripts["start"], keys=a, args=b)
                a, b = ops.complete_call(keys, 60_000, 100, [completion(c, encode_result(
                    Result(id=c.id, status=Status.OK, output=c.id, attempts=1)))
                    for c in claimed])
                timed("complete", 512, scripts["complete"], keys=a, args=b)
    r.close()
    return cost


def sweep_cost(url: str, workers: int, sweeps: int = 400) -> str:
    r = redis.Redis.from_url(url)
    scripts = ops.register(r)
    keys = QueueKeys.for_model("embed", "sweep")
    with inferq.Client(url) as client:
        client.enqueue_many([f"held {i}" for i in range(1000)], model="sweep")
    a, b = ops.claim_call(keys, "w0", 600_000, 1000, 60_000)
    scripts["claim"](keys=a, args=b)
    named = "connected" in inspect.signature(ops.reclaim_call).parameters
    conns = []
    for w in range(workers):
        r.zadd(keys.workers, {f"w{w}": 2**50})
        for _ in range(2):
            c = redis.Redis.from_url(url, client_name=f"inferq-worker:w{w}")
            c.ping()
            conns.append(c)

    def cost(sweep: Callable[[], None]) -> float:
        before = server_cpu_s(r)
        for _ in range(sweeps):
            sweep()
        return (server_cpu_s(r) - before) / sweeps * 1e6

    def plain() -> None:
        extra: dict[str, Any] = {"probe_ms": 10**9} if named else {}
        a, b = ops.reclaim_call(keys, 500, 60_000, 100, **extra)
        scripts["reclaim"](keys=a, args=b)

    def probing() -> None:
        listed = [str(x.get("name", "")) for x in r.client_list(_type="normal")]
        ids = sorted({n.split(":", 1)[1] for n in listed if n.startswith("inferq-worker:")})
        a, b = ops.reclaim_call(keys, 500, 60_000, 100, grace_ms=250,  # type: ignore[call-arg]
                                connected=ids)
        scripts["reclaim"](keys=a, args=b)

    line = f"plain sweep {cost(plain):.0f} us"
    if named:
        line += f", listing sweep (CLIENT LIST + RECLAIM) {cost(probing):.0f} us"
    for c in conns:
        c.close()
    r.close()
    return (line + f" server CPU ({workers} workers connected, 1,000 leases in flight); each "
            "worker sweeps every lease / 8, the fleet lists once per lease / 16")


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def split(url: str, server_pid: int, n: int, together: bool, folder: str) -> str:
    # The worker imports the same inferq (run from a folder that shadows nothing).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "inferq", "--log-level", "error", "worker", "--redis-url", url,
         "--model", "echo", "--max-batch-size", "512", "--max-wait-ms", "2",
         "--max-batch-tokens", "0"], env=env, cwd=folder)
    r = redis.Redis.from_url(url)
    cpu0: list[float] = []

    async def run() -> float:
        async with inferq.AsyncClient(url) as client:
            for h in await client.enqueue_many(["warm"] * 10, model="echo"):
                await h.result(timeout=60)
            r.config_resetstat()
            mine = resource.getrusage(resource.RUSAGE_SELF)
            cpu0.extend((mine.ru_utime + mine.ru_stime, proc_cpu_s(worker.pid),
                          proc_cpu_s(server_pid)))
            prompts = [f"t-{i:08d}-noop-request" for i in range(n)]
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            waits: list[asyncio.Future[object]] = []
            for start in range(0, n, 1000):
                handles = await client.enqueue_many(prompts[start:start + 1000], model="echo")
                waits += ([asyncio.ensure_future(client.results(handles))] if together else
                          [asyncio.ensure_future(h.result()) for h in handles])
            await asyncio.gather(*waits)
            return n / (loop.time() - t0)

    try:
        rate = asyncio.run(run())
        mine = resource.getrusage(resource.RUSAGE_SELF)
        producer = (mine.ru_utime + mine.ru_stime - cpu0[0]) / n * 1e6
        work = (proc_cpu_s(worker.pid) - cpu0[1]) / n * 1e6
        server = (proc_cpu_s(server_pid) - cpu0[2]) / n * 1e6
        commands = sum(v["calls"] for v in r.info("commandstats").values()) / n
    finally:
        worker.terminate()
        worker.wait()
        r.close()
    return (f"{rate:.0f} req/s  producer {producer:.1f} us  worker {work:.1f} us  redis "
            f"{server:.1f} us  total {producer + work + server:.1f}  cmds/req {commands:.2f}")


def enqueue_cost(url: str, n: int, rounds: int) -> str:
    options = inferq.ClientOptions(warn_no_worker=False, settings_ttl_s=1e9)
    replies: list[Any] = []

    def spied(client: Any) -> None:
        """The enqueue script, keeping what the server answers."""
        real = client.scripts["enqueue"]

        def spy(keys: Any, args: Any) -> Any:
            replies.append(real(keys=keys, args=args))
            return replies[-1]

        async def aspy(keys: Any, args: Any) -> Any:
            replies.append(await real(keys=keys, args=args))
            return replies[-1]

        client.presence.every_s = 1e9  # checked once, at the warm-up
        client.scripts["enqueue"] = aspy if isinstance(client, inferq.AsyncClient) else spy

    def stubbed(client: Any) -> None:
        async def astub(keys: Any, args: Any) -> Any:
            return replies[-1]
        client.scripts["enqueue"] = (astub if isinstance(client, inferq.AsyncClient)
                                     else lambda keys, args: replies[-1])

    def timed(seconds: list[float]) -> float:
        return min(seconds) / n * 1e6

    with inferq.Client(url, options=options) as client:
        spied(client)
        client.enqueue("warm", model="echo")
        stubbed(client)
        sync_s = []
        for _ in range(rounds):
            t0 = time.process_time()
            for _ in range(n):
                client.enqueue("x" * 24, model="echo")
            sync_s.append(time.process_time() - t0)

    async def run() -> list[float]:
        async with inferq.AsyncClient(url, options=options) as client:
            spied(client)
            await client.enqueue("warm", model="echo")
            stubbed(client)
            out = []
            for _ in range(rounds):
                t0 = time.process_time()
                for _ in range(n):
                    await client.enqueue("x" * 24, model="echo")
                out.append(time.process_time() - t0)
            return out

    async_s = asyncio.run(run())
    return (f"SDK CPU per enqueue, round trip left out: Client {timed(sync_s):.1f} us, "
            f"AsyncClient {timed(async_s):.1f} us (best of {rounds} x {n})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", choices=("scripts", "split", "sweep", "enqueue"))
    parser.add_argument("--workers", type=int, default=16, help="sweep: workers connected")
    parser.add_argument("--rounds", type=int, default=20, help="scripts, enqueue: rounds")
    parser.add_argument("--requests", type=int, default=20_000,
                        help="split: requests; enqueue: per round")
    parser.add_argument("--results", action="store_true", help="split: await with results()")
    parser.add_argument("--aof", action="store_true", help="the server with AOF (everysec)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # no worker serves the scripts probe's queue
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(tmp, appendonly=args.aof) as srv:
        if args.probe == "scripts":
            cost = scripts_cost(srv.url, args.rounds)
            print("  ".join(f"{k} {statistics.median(v):.1f}" for k, v in cost.items()),
                  f" all four {sum(statistics.median(v) for v in cost.values()):.1f} us "
                  "server CPU per request (medians)")
        elif args.probe == "sweep":
            print(sweep_cost(srv.url, args.workers))
        elif args.probe == "enqueue":
            print(enqueue_cost(srv.url, args.requests, args.rounds))
        else:
            assert srv.process is not None
            print(split(srv.url, srv.process.pid, args.requests, args.results, tmp))
    print(f"inferq from {inferq.__file__}")


if __name__ == "__main__":
    main()
