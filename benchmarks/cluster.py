"""Scenario ``cluster``: the echo model on a local 3-master Redis Cluster, one queue with 1 shard
vs the same queue split into 3 shards (``inferq queue set --shards 3``), with Redis commands and
CPU per request on each master; the method is in benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks.framework import ByMode, Run, Scenario, flag, int_list, render, render_rows
from benchmarks.harness import positive_int, say, stop_child, summary
from benchmarks.stack import (
    check_ok,
    enqueue_and_await,
    redis_delta,
    redis_snapshot,
    spawn_worker,
    summarize_fields,
    wait_registered,
    window_flags,
)
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import SET_SETTINGS, settings_call


@dataclass(frozen=True)
class ClusterConfig:
    requests: int = flag(positive_int, ByMode(20_000, 600), "requests per variant")
    shard_counts: tuple[int, ...] = flag(int_list, "1,3", "shard counts to compare, "
                                         "comma-separated", name="--shards")
    workers: int = flag(positive_int, 3, "worker processes")
    max_batch_size: int = flag(positive_int, 64)
    max_wait_ms: float = flag(float, 2.0)
    chunk: int = flag(positive_int, 500)
    timeout_s: float = 300.0


def spread_model(cluster: Any, prefix: str, shards: int) -> str:
    """A model name whose queue's ``shards`` shards sit on as many different masters as can be."""
    want = min(shards, len(cluster.masters))
    for i in range(500):
        model = f"{prefix}{i}"
        keys = QueueKeys.for_model("embed", model)
        owners = {cluster.master_for(keys.for_shard(k).pending).port for k in range(shards)}
        if len(owners) == want:
            return model
    raise RuntimeError("no model name spreads over the masters")


def set_shards(url: str, model: str, shards: int) -> None:
    from inferq.connection import sync_client

    client = sync_client(url)
    try:
        keys, args = settings_call(QueueKeys.for_model("embed", model).config, shards, "keep")
        client.register_script(SET_SETTINGS)(keys=keys, args=args)
    finally:
        client.close()


def run_variant(run: Run[ClusterConfig], cluster: Any, shards: int, trial: int
                ) -> dict[str, Any]:
    cfg = run.cfg
    model = spread_model(cluster, f"echo-s{shards}t{trial}-", shards)
    set_shards(cluster.url, model, shards)
    workers = [spawn_worker(run.cleanup, cluster.masters[i % len(cluster.masters)].url,
                            model_arg=f"{model}=builtin:echo",
                            worker_id=f"cl-{shards}-{trial}-{i}", log_dir=run.log_dir,
                            flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms))
               for i in range(cfg.workers)]
    wait_registered(cluster.url, workers)
    nodes = {f"127.0.0.1:{m.port}": redis.Redis(port=m.port) for m in cluster.masters}
    keys = QueueKeys.for_model("embed", model)
    owners = {f"127.0.0.1:{cluster.master_for(keys.for_shard(k).pending).port}"
              for k in range(shards)}
    try:
        before = {name: redis_snapshot(c) for name, c in nodes.items()}
        prompts = [f"s{shards}-{i:07d}" for i in range(cfg.requests)]
        results, seconds, enqueue_s = asyncio.run(enqueue_and_await(
            cluster.url, model, prompts, cfg.chunk, workers, cfg.timeout_s))
        after = {name: redis_snapshot(c) for name, c in nodes.items()}
    finally:
        for c in nodes.values():
            c.close()
    check_ok(results, cfg.requests, f"{shards} shard(s)")
    per_node = {name: asdict(redis_delta(before[name], after[name], cfg.requests))
                for name in nodes}
    for w in workers:
        stop_child(w.child)
    throughput = cfg.requests / seconds
    total_cmds = sum(d["commands_per_request"] for d in per_node.values())
    total_cpu = sum(d["cpu_us_per_request"] for d in per_node.values())
    say(f"  {shards} shard(s): {throughput:8.1f} req/s; Redis {total_cmds:.1f} cmds/req, "
        f"{total_cpu:.0f} us CPU/req over {len(owners)} master(s)")
    return {
        "shards": shards, "model": model, "requests": cfg.requests,
        "throughput": throughput, "seconds": seconds, "enqueue_s": enqueue_s,
        "masters_holding_the_queue": sorted(owners),
        "redis_commands_per_request_total": total_cmds,
        "redis_cpu_us_per_request_total": total_cpu,
        "per_node": {name: {k: d[k] for k in ("commands_per_request", "cpu_us_per_request",
                                              "cpu_share", "ops_per_s", "calls")}
                     for name, d in per_node.items()},
    }


def figures(cfg: ClusterConfig, trials: Mapping[int, Sequence[Mapping[str, Any]]]
            ) -> dict[str, Any]:
    per = {}
    for shards, ts in trials.items():
        per[str(shards)] = {
            "shards": shards,
            **summarize_fields(ts, "throughput", "redis_commands_per_request_total",
                               "redis_cpu_us_per_request_total"),
            "redis_cpu_us_per_request_per_holding_master": summary(
                [t["redis_cpu_us_per_request_total"] / len(t["masters_holding_the_queue"])
                 for t in ts]),
            "trials": list(ts),
        }
    return {"per_shards": per}


def results_markdown(r: Mapping[str, Any]) -> str:
    return render("cluster", r, rows=render_rows("cluster.row", (
        {**s, "shards": k, "spread": "; ".join(
            f"{n.rpartition(':')[2]}: {d['commands_per_request']:.1f} cmds, "
            f"{d['cpu_us_per_request']:.0f} us"
            for n, d in sorted(s["trials"][-1]["per_node"].items()))}
        for k, s in r["per_shards"].items())))


class ClusterScenario(Scenario[ClusterConfig]):
    name = "cluster"
    title = "echo on a 3-master Redis Cluster: one queue, 1 shard vs 3 shards"
    quick_help = "600 requests per variant, 1 trial (~1 min)"
    config = ClusterConfig
    markdown = staticmethod(results_markdown)

    def measure(self, run: Run[ClusterConfig]) -> dict[str, Any]:
        from tests.support.cluster import LocalCluster

        base = Path(tempfile.mkdtemp(prefix="inferq-bench-cluster-"))
        cluster = LocalCluster(base, masters=3, appendonly=True)
        run.cleanup.on_close("cluster", cluster.stop)
        say(f"starting a 3-master cluster ({Path(cluster.binary).name}) in {base}")
        cluster.start()
        trials: dict[int, list[dict[str, Any]]] = {s: [] for s in run.cfg.shard_counts}
        for trial in range(run.trials):
            for shards in run.cfg.shard_counts:
                trials[shards].append(run_variant(run, cluster, shards, trial))
        cluster.stop()
        return figures(run.cfg, trials)


SCENARIO = ClusterScenario()
