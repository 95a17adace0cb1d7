"""Scenario ``overhead``: what the queue itself costs, with the built-in ``echo`` model (no
compute), side by side with BullMQ (on Node.js and its Python port), SAQ, arq and rq on the
same Redis server. How each pass is timed and each peer set up: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from benchmarks import charts, peers
from benchmarks.framework import ByMode, Run, Scenario, int_list, noise_of, render
from benchmarks.harness import (
    BenchmarkFailed,
    Cleanup,
    fmt_range,
    markdown_table,
    positive_int,
    say,
    scaled,
    stop_child,
    summary,
    verdict,
    version,
)
from benchmarks.peers.arq_peer import ARQ_TUNED
from benchmarks.peers.bullmq_peer import BULLMQ_BULK, NODE_DIR
from benchmarks.peers.catalog import PEERS
from benchmarks.peers.peer import ENQUEUE_CONCURRENCY, POLL_S, Peer, peer_env
from benchmarks.stack import (
    SCRIPT_CALLS,
    SCRIPT_INNER_COMMANDS,
    RedisSnapshot,
    WorkerProc,
    add_worker_arguments,
    batches_of,
    check_ok,
    enqueue_and_await,
    fill_and_drain,
    load_str,
    merge_counters,
    paused,
    pcts,
    queue_probe,
    redis_delta,
    redis_snapshot,
    served_s,
    spawn_workers,
    stop_all,
    sum_cpu,
    summarize_fields,
    summarize_trials,
    window_flags,
)
from inferq.protocol.keys import QueueKeys

if TYPE_CHECKING:
    from inferq.protocol.codec import Result

#: Issue #24: end to end and draining, one inferq worker vs the best peer (BullMQ on Node.js).
TARGET_RATIO = 3.0
TARGET_ONE_WORKER = 20_000.0
#: Issue #24, one worker end to end: all-in CPU per request (producer + worker + Redis), Redis's
#: share, and the commands Redis executes per request (those inside scripts included).
TARGET_CPU_US, TARGET_REDIS_US, TARGET_COMMANDS = 30.0, 10.0, 4.0


# ---------------------------------------------------------------------------- baselines


def baseline_pass(cleanup: Cleanup, url: str, peer: Peer, jobs: int, log_dir: Path,
                  server: int | None, timeout_s: float) -> dict[str, Any]:
    """The peer's worker started for this pass only (its polling never disturbs the other
    passes) on its own database; a warm-up of 20 jobs, then ``jobs`` no-op jobs, timed from
    the first enqueue to the last job's own finish time."""
    db_url = url.rsplit("/", 1)[0] + f"/{peer.db}"
    client = redis.Redis.from_url(db_url)
    client.flushdb()
    argv, env = peer.worker(db_url)
    child = cleanup.spawn(peer.name, argv, log_path=log_dir / f"{peer.name}.log",
                          env={**peer_env(), **env})

    def check(what: str, deadline: float) -> None:
        if not child.alive() or time.monotonic() > deadline:
            raise BenchmarkFailed(f"{peer.name}: {what} not done (worker exit code "
                                  f"{child.process.poll()})\n{child.log_tail()}")

    async def go(n: int) -> tuple[Any, ...]:
        await peer.open(db_url)
        try:
            probe = queue_probe(server, [child.process.pid])
            before = redis_snapshot(client)
            probe.start()
            handles, t0, enqueue_s = await peer.enqueue(n)
            checks, deadline = 1, time.monotonic() + timeout_s
            while await peer.remaining(n):
                check("jobs", deadline)
                checks += 1
                await asyncio.sleep(POLL_S)
            cpu = probe.stop()
            if peer.producer_cpu_s is not None:
                cpu["producer"] = (cpu["producer"] or 0.0) + peer.producer_cpu_s
            work = redis_delta(before, redis_snapshot(client), n,
                               own={k: v * checks for k, v in peer.poll.items()})
            return await peer.times(handles), t0, enqueue_s, cpu, work
        finally:
            await peer.close()

    try:
        deadline = time.monotonic() + 60
        while not peer.ready(client):
            check("start", deadline)
            time.sleep(POLL_S)
        asyncio.run(go(20))  # warm-up
        times, t0, enqueue_s, cpu, work = asyncio.run(go(jobs))
    finally:
        stop_child(child)
        client.flushdb()
        client.close()
    if len(times) < jobs:
        raise BenchmarkFailed(f"{peer.name}: only {len(times)} of {jobs} jobs have times")
    end, first_start = max(e for _, e, _ in times), min(s for s, _, _ in times)
    failed = sum(not ok for _, _, ok in times)
    out: dict[str, Any] = {
        "throughput": jobs / max(end - t0, 1e-6), "seconds": end - t0,
        "drain_throughput": jobs / max(end - first_start, 1e-6),
        "enqueue_seconds": enqueue_s, "enqueue_rate": jobs / max(enqueue_s, 1e-6),
        "failed": failed, "jobs": jobs, "cpu_seconds": cpu, "other_load": cpu["other_load"],
        "cpu_us_per_request": _cpu_us(cpu, jobs), "redis": asdict(work)}
    say(f"  {peer.name:<11} {out['throughput']:8.0f} jobs/s ({jobs} jobs in {end - t0:.2f} s; "
        f"first start -> last finish {out['drain_throughput']:.0f}/s; enqueue "
        f"{out['enqueue_rate']:.0f}/s); CPU us/job worker "
        f"{out['cpu_us_per_request']['workers']:.0f}, Redis "
        f"{out['cpu_us_per_request']['server']:.0f}; {work.commands_per_request:.1f} "
        f"Redis commands/job; other load {load_str(cpu['other_load'])}")
    if failed:
        raise BenchmarkFailed(f"{peer.name}: {failed} jobs failed")
    return out


@dataclass(frozen=True)
class OverheadConfig:
    requests: int
    worker_counts: tuple[int, ...]
    chunk: int
    waiters: int
    wait: str
    aof: bool
    max_batch_size: int
    max_wait_ms: float
    warmup: int
    arq_jobs: int
    rq_jobs: int
    rq_fork_jobs: int
    peer_jobs: int
    baselines: tuple[str, ...]
    shard_counts: tuple[int, ...]
    shard_requests: int
    timeout_s: float = 300.0

    @property
    def arq_tuned(self) -> dict[str, float]:
        return ARQ_TUNED


def _baselines(text: str) -> tuple[str, ...]:
    chosen = tuple(b.strip() for b in text.split(",") if b.strip())
    unknown = set(chosen) - set(PEERS) - {"none"}
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {sorted(unknown)}; known: {', '.join(PEERS)}")
    return () if chosen == ("none",) else chosen


# ------------------------------------------------------------------------------- inferq


@dataclass
class Fleet:
    count: int
    model: str
    workers: list[WorkerProc]

    @property
    def name(self) -> str:
        return f"inferq-{self.count}"


def _prompts(tag: str, n: int) -> list[str]:
    # ~24 bytes each: the size of a short id or sentence reference, not of a document.
    return [f"{tag}-{i:08d}-noop-request" for i in range(n)]


def _cpu_us(cpu: Mapping[str, float | None], n: int) -> dict[str, float | None]:
    def per(value: float | None) -> float | None:
        return None if value is None else value / max(n, 1) * 1e6
    return {"producer": per(cpu.get("producer")), "workers": per(sum_cpu(cpu, "worker")),
            "server": per(cpu.get("server"))}


def _inferq_figures(results: Sequence[Result], cpu: Mapping[str, float | None],
                    work: Any, **extra: Any) -> dict[str, Any]:
    n = len(results)
    sizes = batches_of(results)
    return {
        **extra, "batch_sizes": dict(sorted(sizes.items())),
        "mean_batch_size": n / max(sum(sizes.values()), 1),
        "cpu_seconds": cpu, "other_load": cpu["other_load"],
        "cpu_us_per_request": _cpu_us(cpu, n), "redis": asdict(work)}


def inferq_e2e_pass(url: str, fleet: Fleet, cfg: OverheadConfig, tag: str,
                    server: int | None) -> dict[str, Any]:
    prompts = _prompts(tag, cfg.requests)
    client = redis.Redis.from_url(url)
    probe = queue_probe(server, [w.pid for w in fleet.workers])
    before = redis_snapshot(client)
    probe.start()
    results, seconds, enqueue_s = asyncio.run(enqueue_and_await(
        url, fleet.model, prompts, cfg.chunk, fleet.workers, cfg.timeout_s, cfg.waiters,
        together=cfg.wait == "results"))
    cpu = probe.stop()
    work = redis_delta(before, redis_snapshot(client), len(results))
    client.close()
    check_ok(results, len(prompts), f"{fleet.name} end to end", outputs=prompts)
    n = len(results)
    total = [r.total_ms for r in results if r.total_ms is not None]
    wait = [r.queue_wait_ms for r in results if r.queue_wait_ms is not None]
    out = _inferq_figures(results, cpu, work, throughput=n / seconds, seconds=seconds,
                          enqueue_seconds=enqueue_s, enqueue_rate=n / enqueue_s,
                          total_ms=pcts(total), queue_wait_ms=pcts(wait))
    us = out["cpu_us_per_request"]
    say(f"  {fleet.name:<11} end to end {out['throughput']:8.0f} req/s in {seconds:.2f} s "
        f"(enqueue {n / enqueue_s:.0f}/s); mean batch {out['mean_batch_size']:.0f}; CPU us/req "
        f"producer {us['producer']:.0f}, workers {us['workers']:.0f}, Redis {us['server']:.0f};"
        f" {work.commands_per_request:.1f} Redis commands/req; other load "
        f"{load_str(cpu['other_load'])}")
    return out


def inferq_drain_pass(cleanup: Cleanup, url: str, fleet: Fleet, cfg: OverheadConfig, tag: str,
                      server: int | None) -> dict[str, Any]:
    prompts = _prompts(tag, cfg.requests)
    d = fill_and_drain(cleanup, url, fleet.model, prompts, chunk=cfg.chunk,
                       paused_workers=fleet.workers, active=fleet.workers, server=server,
                       timeout_s=cfg.timeout_s)
    check_ok(d.results, len(prompts), f"{fleet.name} drain", outputs=prompts)
    out = _inferq_figures(d.results, d.cpu, d.redis_drain, throughput=d.throughput,
                          wall_throughput=len(d.results) / d.wall_s, seconds=d.seconds,
                          redis_fill=asdict(d.redis_fill))
    us = out["cpu_us_per_request"]
    say(f"  {fleet.name:<11} drain      {out['throughput']:8.0f} req/s (Redis clock; wall "
        f"{out['wall_throughput']:.0f}); mean batch {out['mean_batch_size']:.0f}; CPU us/req "
        f"workers {us['workers']:.0f}, Redis {us['server']:.0f}; other load "
        f"{load_str(d.cpu['other_load'])}")
    return out


def shard_pass(cleanup: Cleanup, url: str, server: int | None, shards: int, n: int,
               cfg: OverheadConfig, log_dir: Path) -> dict[str, Any]:
    """A queue of ``shards`` shards (its own, ``echo-s<shards>``), filled with ``n`` requests
    while its one worker is paused, then drained: what Redis executes per request (claims,
    their PEEKs at the shards' heads, starts, completions) and the drain rate."""
    from inferq.producer.aio import AsyncClient

    model = f"echo-s{shards}"
    keys = QueueKeys.for_model("embed", model)
    client = redis.Redis.from_url(url)
    client.hset(keys.config, mapping={"shards": shards, "shards_seen": shards})
    [worker] = spawn_workers(cleanup, url, [f"bench-overhead-s{shards}"],
                             model_arg=f"{model}=builtin:echo", log_dir=log_dir,
                             flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms))
    prompts = _prompts(f"s{shards}", n)

    async def fill_then_drain(resume: Callable[[Sequence[int]], None]
                              ) -> tuple[list[Result], RedisSnapshot, float]:
        async with AsyncClient(url) as producer:
            handles = [h for start in range(0, n, cfg.chunk) for h in
                       await producer.enqueue_many(prompts[start:start + cfg.chunk],
                                                   model=model)]
            before = redis_snapshot(client)
            t0 = time.perf_counter()
            resume([worker.pid])
            results = await producer.results(handles, timeout=cfg.timeout_s)
            return results, before, time.perf_counter() - t0

    try:
        with paused(cleanup, [worker.pid]) as resume:
            results, before, wall = asyncio.run(fill_then_drain(resume))
        work = redis_delta(before, redis_snapshot(client), n)
    finally:
        stop_child(worker.child)
        client.close()
    check_ok(results, n, f"{shards} shards", outputs=prompts)
    out = {"shards": shards, "requests": n, "throughput": n / served_s(results),
           "wall_throughput": n / wall, "redis": asdict(work)}
    say(f"  {shards:>3} shards: drain {out['throughput']:8.0f} req/s; "
        f"{work.commands_per_request:.2f} Redis commands/req, "
        f"{work.script_calls_per_request:.3f} script calls/req, Redis CPU "
        f"{work.cpu_us_per_request:.0f} us/req")
    return out


# ------------------------------------------------------------------------------ reports


def figures(fleets: Mapping[str, Fleet], trials: Mapping[str, Sequence[Mapping[str, Any]]],
            skipped: Mapping[str, str], exit_codes: Mapping[str, int | None]) -> dict[str, Any]:
    summaries: dict[str, Any] = {}
    loads: list[float | None] = []
    for name, ts in trials.items():
        if name in fleets:
            loads += [t[m]["other_load"] for t in ts for m in ("e2e", "drain")]
            summaries[name] = {
                "workers": fleets[name].count, "e2e": _summarize_pass([t["e2e"] for t in ts]),
                "drain": _summarize_pass([t["drain"] for t in ts]),
                "batch_sizes_e2e": merge_counters(t["e2e"]["batch_sizes"] for t in ts),
                "trials": list(ts)}
        else:
            loads += [t["other_load"] for t in ts]
            summaries[name] = {"label": PEERS[name].label, "workers": 1,
                               "e2e": _summarize_pass(ts),
                               "drain_throughput": summarize_trials(ts, ["drain_throughput"]),
                               "trials": list(ts)}
    report: dict[str, Any] = {"variants": summaries, "skipped": dict(skipped),
                              "worker_exit_codes": dict(exit_codes), "noise": noise_of(loads)}
    one = summaries.get("inferq-1")
    base_names = [n for n in trials if n not in fleets]
    ratios: dict[str, Any] = {}
    if one is not None and base_names:
        for b in base_names:
            ratios[b] = summary([i["e2e"]["throughput"] / t["throughput"]
                                 for i, t in zip(trials["inferq-1"], trials[b], strict=True)])
        best = max(base_names, key=lambda b: summaries[b]["e2e"]["throughput"]["median"] or 0.0)
        ratios["best_baseline"] = best
        ratios["verdict"] = verdict(ratios[best]["median"], TARGET_RATIO)
    report["ratios"] = ratios
    if one is not None:
        median = one["e2e"]["throughput"]["median"]
        report["one_worker_target"] = {
            "target": TARGET_ONE_WORKER, "e2e_median": median,
            "drain_median": one["drain"]["throughput"]["median"],
            "verdict": verdict(median, TARGET_ONE_WORKER)}
    return report


def drain_ratios(report: Mapping[str, Any]) -> dict[str, Any]:
    """inferq's one-worker drain throughput over each baseline's, trial by trial, and the
    verdict against the best baseline."""
    v = report["variants"]
    one = v.get("inferq-1")
    names = [n for n in v if not n.startswith("inferq")]
    if one is None or not names:
        return {}
    mine = one["drain"]["throughput"]["trials"]
    out: dict[str, Any] = {n: summary([a / b for a, b in zip(
        mine, v[n]["drain_throughput"]["trials"], strict=True) if b]) for n in names}
    best = max(names, key=lambda n: v[n]["drain_throughput"]["median"] or 0.0)
    out["best_baseline"] = best
    out["verdict"] = verdict(out[best]["median"], TARGET_RATIO)
    return out


def _summarize_pass(ts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out = summarize_fields(ts, "throughput", "other_load",
                           *(f"cpu_us_{p}=cpu_us_per_request.{p}"
                             for p in ("producer", "workers", "server")),
                           *(f"redis.{k}" for k in ("commands_per_request",
                                                    "client_commands_per_request",
                                                    "script_calls_per_request", "ops_per_s",
                                                    "cpu_share")),
                           *(k for k in ("enqueue_rate", "mean_batch_size", "wall_throughput")
                             if any(k in t for t in ts)),
                           *(f"total_ms_{q}=total_ms.{q}" for q in ("p50", "p99")
                             if any("total_ms" in t for t in ts)))
    commands: dict[str, list[float]] = {}
    for t in ts:
        for cmd, v in t["redis"]["by_command_per_request"].items():
            commands.setdefault(cmd, []).append(v)
    out["redis_by_command"] = {cmd: sorted(vs)[len(vs) // 2] for cmd, vs in commands.items()}
    return out


def draw_plots(r: Mapping[str, Any], folder: Path) -> list[Path]:
    v = r["variants"]
    names = list(v)
    groups = [f"inferq\n{v[n]['workers']} worker{'s' if v[n]['workers'] > 1 else ''}"
              if n.startswith("inferq") else n.replace("-", "\n") for n in names]

    def trials(name: str, key: str) -> list[float]:
        s = (v[name]["e2e"]["throughput"] if key == "e2e" else v[name]["drain"]["throughput"]
             if "drain" in v[name] else v[name]["drain_throughput"])
        return list(s["trials"])

    labels = {"e2e": "end to end", "drain": "drain (queue + workers only, no producer)"}
    return [charts.trial_bars(
        folder / "overhead-throughput.png",
        title="No-op requests per second (log scale); arq and rq: one worker process",
        ylabel="requests/s", groups=groups,
        values={labels[k]: [trials(n, k) for n in names] for k in labels},
        hlines=[("target: 20,000 req/s end to end, one inferq worker", TARGET_ONE_WORKER)],
        logy=True, note="median over trials, bars = min..max; one Redis server for all")]


def _f(s: Mapping[str, Any], digits: int = 0) -> str:
    return fmt_range(s, digits)


def results_markdown(r: Mapping[str, Any]) -> str:
    v, c = r["variants"], r["config"]
    rows = []
    for name, s in v.items():
        e2e, inferq = s["e2e"], name.startswith("inferq")
        rows.append([
            f"**inferq**, {s['workers']} worker process{'es' if s['workers'] > 1 else ''}"
            if inferq else s["label"], _f(e2e["throughput"]),
            _f(scaled(e2e["throughput"], 1 / s["workers"])),
            _f(s["drain"]["throughput"] if inferq else s["drain_throughput"]),
            _f(e2e["enqueue_rate"]) if "enqueue_rate" in e2e else "n/a",
            " / ".join(_f(e2e[f"cpu_us_{p}"]) for p in ("producer", "workers", "server")),
            f"{_f(e2e['redis_commands_per_request'], 1)} "
            f"({_f(e2e['redis_client_commands_per_request'], 2)})",
            _f(scaled(e2e["other_load"], 100))])
    table = markdown_table(
        ["variant", "end to end req/s", "per worker process", "drain req/s (no producer)",
         "enqueue req/s", "CPU us/request: producer / workers / Redis",
         "Redis commands/request (sent by clients)", "other tenants' load %"], rows)
    one = v.get("inferq-1")
    cmd_table = ""
    if one is not None:
        e2e, drain = one["e2e"]["redis_by_command"], one["drain"]["redis_by_command"]
        cmd_rows = [[f"`{name.upper()}`", "script call (one round trip)" if name in SCRIPT_CALLS
                     else "inside a script" if name in SCRIPT_INNER_COMMANDS
                     else "sent by a client", f"{e2e.get(name, 0.0):.4f}",
                     f"{drain.get(name, 0.0):.4f}"]
                    for name in sorted(set(e2e) | set(drain), key=lambda k: (-e2e.get(k, 0.0), k))]
        cmd_rows += [[label, "", *(_f(one[p][key], digits) for p in ("e2e", "drain"))]
                     for label, key, digits in (
                         ("**all commands**", "redis_commands_per_request", 2),
                         ("**sent by clients**", "redis_client_commands_per_request", 3))]
        cmd_table = markdown_table(["command", "where", "per request, end to end",
                                    "per request, drain"], cmd_rows)
    ratios, ratio_rows = r["ratios"], []
    best = ratios.get("best_baseline")
    for name, s in ratios.items():
        if isinstance(s, dict):
            ratio_rows.append([f"inferq (1 worker) / {v[name]['label']}, end to end", _f(s, 1),
                               f">= {TARGET_RATIO:.0f}" if name == best else "",
                               ratios["verdict"] if name == best else ""])
    drained = drain_ratios(r)
    if drained:
        b = drained["best_baseline"]
        ratio_rows.append([f"inferq (1 worker) / {v[b]['label']}, draining a full queue "
                           "(worker-bound, no producer)", _f(drained[b], 1),
                           f">= {TARGET_RATIO:.0f}", drained["verdict"]])
    if r.get("one_worker_target"):
        ratio_rows += [["inferq, one worker, end to end req/s", _f(one["e2e"]["throughput"]),
                        f">= {TARGET_ONE_WORKER:,.0f}", r["one_worker_target"]["verdict"]],
                       ["inferq, one worker, drain req/s (no producer in the loop)",
                        _f(one["drain"]["throughput"]), "(context)", ""]]
        ratio_rows += cpu_target_rows(one["e2e"])
    return render(
        "overhead", r, table=table, cmd_table=cmd_table, reading=cpu_reading(r),
        ratio_table=markdown_table(["measure", "median (min..max)", "target", "verdict"],
                                   ratio_rows),
        shard_table=shard_table(r.get("sharded", [])),
        skipped="".join(f"\n- Skipped {b}: {why}." for b, why in r["skipped"].items()),
        waiting="one `AsyncClient.results()` per chunk awaiting its results"
        if c.get("wait") == "results" else "one task per handle awaiting `result()`"
        if not c["waiters"] else f"{c['waiters']} coroutines awaiting `result()` in enqueue order",
        aof="with AOF (`appendfsync everysec`)" if c["aof"] else "**without AOF** (`--no-aof`)",
        peers=render("overhead.peers", r, bulk=BULLMQ_BULK, concurrency=peers.CONCURRENCY,
                     enqueue_concurrency=ENQUEUE_CONCURRENCY, arq=ARQ_TUNED,
                     node_bullmq=r["machine"]["versions"].get("bullmq_node") or "?").rstrip())


def cpu_target_rows(e2e: Mapping[str, Any]) -> list[list[str]]:
    """Issue #24's CPU targets, one worker end to end: all-in CPU, Redis CPU, commands."""
    parts = [e2e[f"cpu_us_{p}"]["median"] for p in ("producer", "workers", "server")]
    total = None if None in parts else sum(parts)
    commands = e2e["redis_commands_per_request"]["median"]
    return [
        ["inferq, one worker: all-in CPU us/request end to end (producer + worker + Redis)",
         "n/a" if total is None else f"{total:.0f}", f"<= {TARGET_CPU_US:.0f}",
         verdict(total, TARGET_CPU_US, at_most=True)],
        ["inferq, one worker: Redis CPU us/request end to end", _f(e2e["cpu_us_server"]),
         f"<= {TARGET_REDIS_US:.0f}", verdict(parts[2], TARGET_REDIS_US, at_most=True)],
        ["inferq, one worker: Redis commands/request end to end (inside scripts included)",
         _f(e2e["redis_commands_per_request"], 2), f"<= {TARGET_COMMANDS:.0f}",
         verdict(commands, TARGET_COMMANDS, at_most=True)]]


def shard_table(sharded: Sequence[Mapping[str, Any]]) -> str:
    """Commands and Redis CPU per request of one worker draining a queue of S shards."""
    if not sharded:
        return ""
    rows = [[str(p["shards"]), f"{p['throughput']:.0f}",
             f"{p['redis']['commands_per_request']:.2f}",
             f"{p['redis']['script_calls_per_request']:.3f}",
             f"{p['redis']['by_command_per_request'].get('zrange', 0.0):.2f}",
             f"{p['redis']['cpu_us_per_request']:.0f}"] for p in sharded]
    return markdown_table(["shards", "drain req/s", "Redis commands/request",
                           "script calls/request", "ZRANGE/request (2 per PEEK)",
                           "Redis CPU us/request"], rows)


def cpu_reading(r: Mapping[str, Any]) -> str:
    """What the CPU cost per request implies: the end-to-end rate this machine's CPUs can
    carry at all, and the rate one Redis core can, from the one-worker figures."""
    one = r["variants"].get("inferq-1")
    if one is None:
        return ""
    parts = {p: one["e2e"][f"cpu_us_{p}"]["median"] for p in ("producer", "workers", "server")}
    if any(x is None or x <= 0 for x in parts.values()):
        return ""
    total = sum(parts.values())
    cpus = r["machine"].get("usable_cpus") or r["machine"].get("logical_cpus") or 1
    largest = {"producer": "producer's (enqueue, then awaiting each result)",
               "workers": "worker's", "server": "Redis server's"}
    return render("overhead.reading", {}, p=parts, total=total, cpus=cpus,
                  e2e_cap=cpus * 1e6 / total, redis_cap=1e6 / parts["server"],
                  worker_drain=one["drain"]["cpu_us_workers"]["median"] or 0.0,
                  redis_drain=one["drain"]["cpu_us_server"]["median"] or 0.0,
                  largest=largest[max(parts, key=lambda k: parts[k])]).rstrip()


# ------------------------------------------------------------------------------ scenario


class Overhead(Scenario[OverheadConfig]):
    name = "overhead"
    title = "queue cost with a no-op model, vs BullMQ (Node.js and Python), SAQ, arq and rq"
    quick_help = "10,000 requests, few baseline jobs, 1 trial (~2 min)"
    config = OverheadConfig
    plots = staticmethod(draw_plots)
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--requests", type=positive_int, default=ByMode(50_000, 10_000),
                            help="inferq requests per pass (default %(default)s)")
        parser.add_argument("--workers", dest="worker_counts", type=int_list, default=(1, 2, 4),
                            help="inferq worker process counts, comma-separated (default 1,2,4)")
        parser.add_argument("--chunk", type=positive_int, default=1000,
                            help="requests per enqueue_many call (default 1000)")
        parser.add_argument("--wait", choices=("results", "handles"), default="results",
                            help="how the producer awaits: one AsyncClient.results() per "
                                 "enqueue_many chunk (default), or each handle's result() "
                                 "(see --waiters)")
        parser.add_argument("--waiters", type=int, default=0,
                            help="with --wait handles: coroutines awaiting results in enqueue "
                                 "order; 0 (default) = one task per request")
        parser.add_argument("--shards", dest="shard_counts",
                            type=lambda text: () if text == "none" else int_list(text),
                            default=ByMode((1, 8, 64, 256), (1, 64)),
                            help="shard counts of the sharded-queue drain passes, one worker "
                                 "each, or 'none' (default 1,8,64,256)")
        parser.add_argument("--shard-requests", type=positive_int,
                            default=ByMode(20_000, 5_000),
                            help="requests per sharded-queue drain pass (default %(default)s)")
        parser.add_argument("--no-aof", dest="aof", action="store_false",
                            help="run the server without AOF (default: AOF on, appendfsync "
                                 "everysec), to see what persistence costs")
        add_worker_arguments(parser, max_batch_size=512, max_wait_ms=2.0)
        for flag, full, quick, what in (
                ("arq-jobs", 3_000, 500, "arq pass"), ("rq-jobs", 2_000, 300,
                                                        "rq SimpleWorker pass"),
                ("rq-fork-jobs", 600, 150, "forking rq worker pass"),
                ("peer-jobs", 5_000, 1_000, "BullMQ (Node.js, Python) and per SAQ pass")):
            parser.add_argument(f"--{flag}", type=positive_int, default=ByMode(full, quick),
                                help=f"jobs per {what} (default %(default)s)")
        parser.add_argument("--baselines", type=_baselines, default=tuple(PEERS),
                            help=f"baselines to run, comma-separated, or 'none' (default "
                                 f"{','.join(PEERS)}; skipped when not installed)")
        parser.set_defaults(warmup=ByMode(2_000, 1_000))

    def measure(self, run: Run[OverheadConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server(appendonly=cfg.aof)
        versions = run.machine["versions"]
        versions.update({lib: version(lib) for lib in ("arq", "rq", "bullmq", "saq")})
        skipped = {b: why for b in cfg.baselines if (why := PEERS[b].missing())}
        for b, why in skipped.items():
            say(f"skipping {b}: {why}")
        if "bullmq-node" in cfg.baselines and "bullmq-node" not in skipped:
            versions["node"] = subprocess.run(["node", "--version"], capture_output=True,
                                              text=True, check=False).stdout.strip()
            versions["bullmq_node"] = json.loads(
                (NODE_DIR / "node_modules/bullmq/package.json").read_text())["version"]
        baselines = [b for b in cfg.baselines if b not in skipped]
        say(f"{self.name} benchmark: {cfg.requests} requests per inferq pass x {run.trials} "
            f"trial(s), inferq workers {list(cfg.worker_counts)}, baselines "
            f"{baselines or 'none'}")
        fleets: dict[str, Fleet] = {}
        for count in cfg.worker_counts:
            fleet = Fleet(count, f"echo-w{count}", spawn_workers(
                run.cleanup, url, [f"bench-overhead-w{count}-{i}" for i in range(count)],
                model_arg=f"echo-w{count}=builtin:echo", log_dir=run.log_dir,
                flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms)))
            fleets[fleet.name] = fleet
        say("workers ready; warming up")
        for fleet in fleets.values():  # scripts cached, pools open, the window fitted
            prompts = _prompts("warm", cfg.warmup)
            results, _, _ = asyncio.run(enqueue_and_await(url, fleet.model, prompts, cfg.chunk,
                                                           fleet.workers, cfg.timeout_s))
            check_ok(results, len(prompts), f"{fleet.name} warm-up", outputs=prompts)

        trials: dict[str, list[dict[str, Any]]] = {v: [] for v in [*fleets, *baselines]}
        for trial, order in run.rotations(list(trials)):
            for variant in order:
                tag = f"t{trial}"
                if variant in fleets:
                    fleet = fleets[variant]
                    trials[variant].append({
                        "e2e": inferq_e2e_pass(url, fleet, cfg, f"{tag}e", server.pid),
                        "drain": inferq_drain_pass(run.cleanup, url, fleet, cfg, f"{tag}d",
                                                   server.pid)})
                else:
                    peer = PEERS[variant]
                    trials[variant].append(baseline_pass(
                        run.cleanup, url, peer, peer.jobs(cfg), run.log_dir, server.pid,
                        cfg.timeout_s))
        sharded = [shard_pass(run.cleanup, url, server.pid, k, cfg.shard_requests, cfg,
                              run.log_dir) for k in cfg.shard_counts]
        exit_codes = stop_all(server, {w.worker_id: w for f in fleets.values()
                                       for w in f.workers})
        return {**figures(fleets, trials, skipped, exit_codes), "sharded": sharded}


SCENARIO = Overhead()
