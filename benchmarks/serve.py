"""Scenario ``serve``: MiniLM embeddings over HTTP, inferq's gateway and SDK vs LitServe, side
by side; the variants, the check that all compute the same vectors, and the closed and open
loops are described in benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import corpus
from benchmarks.embed import MAX_WORDS, MIN_WORDS
from benchmarks.framework import (
    ByMode,
    Run,
    Scenario,
    flag,
    float_list,
    int_list,
    noise_of,
    render,
    render_rows,
    switch,
)
from benchmarks.harness import (
    BenchmarkFailed,
    CpuProbe,
    fmt_range,
    positive_int,
    say,
    summary,
    verdict,
    version,
)
from benchmarks.loadgen import HttpPool, LoadResult, closed_loop, open_loop, poisson, request_bytes
from benchmarks.stack import (
    at,
    cpu_by_role,
    gateway,
    litserve,
    load_str,
    pcts,
    spawn_worker,
    summarize_trials,
    tree,
    wait_registered,
)

TARGET_RATIO = 1.2
CORPUS_SEED = 11
MODEL = "minilm"
EQUAL_ATOL = 1e-5
#: The gateway as it was before this scenario's work on it: FastAPI for every call, one
#: enqueue per call.
PLAIN = "gateway-plain"


@dataclass(frozen=True)
class ServeConfig:
    requests: int = flag(positive_int, ByMode(2_000, 160), "answers per closed-loop pass")
    open_requests: int = flag(positive_int, ByMode(1_000, 80), "requests per open-loop pass")
    clients: int = flag(positive_int, 64, "concurrent clients of the closed loop")
    loads: tuple[float, ...] = flag(float_list, "0.5,0.8", "open-loop rates, fractions of each "
                                    "variant's closed-loop capacity")
    gateway_workers: tuple[int, ...] = flag(int_list, "1,2",
                                            "gateway process counts to run (`--workers`)")
    litserve_batch: int = flag(positive_int, 32, "LitServe max_batch_size")
    litserve_timeout_ms: float = flag(float, 10.0, "LitServe batch_timeout in ms")
    limit_batch_sizes: tuple[int, ...] = flag(int_list, "8,16,32", "bare-model batch sizes")
    limit_texts: int = flag(positive_int, ByMode(512, 128), "texts per bare-model pass")
    plain_gateway: bool = switch("skip the gateway without its fast path and coalescing (the "
                                 "'before' of the gateway's CPU per request)",
                                 name="--no-plain-gateway")
    skip_litserve: bool = switch("run without LitServe (also when it is not installed)")
    timeout_s: float = 300.0


# --------------------------------------------------------------------------- the passes


@dataclass
class Variant:
    name: str
    label: str
    port: int | None  # None: the SDK path
    processes: dict[str, int | None]


async def load(v: Variant, url: str, texts: Sequence[str], clients: int, n: int,
               arrivals: Sequence[float] | None, timeout_s: float) -> LoadResult:
    """A closed loop of ``clients`` (``arrivals`` None) or an open loop, over HTTP or the SDK."""
    if v.port is None:
        from inferq import AsyncClient

        async with AsyncClient(url) as client:
            async def call(i: int) -> Any:
                handle = await client.enqueue(texts[i % len(texts)], model=MODEL)
                return await handle.result(timeout=timeout_s)

            await client.enqueue("warm", model=MODEL)  # scripts loaded, pool open
            return await (closed_loop([call] * clients, n) if arrivals is None
                          else open_loop(call, arrivals))
    raws = [request_bytes("127.0.0.1", v.port, "/v1/embeddings",
                          json.dumps({"input": t, "model": MODEL}).encode()) for t in texts]
    pool = await HttpPool("127.0.0.1", v.port, raws).connect(clients if arrivals is None else 64)
    try:
        return await (closed_loop([pool.call] * clients, n) if arrivals is None
                      else open_loop(pool.call, arrivals))
    finally:
        pool.close()


def run_pass(v: Variant, url: str, texts: Sequence[str], *, clients: int, n: int,
             rate: float | None = None, seed: int = 0, timeout_s: float) -> dict[str, Any]:
    """The closed loop (no ``rate``) or an open loop at ``rate``, with the CPU of every
    process of the variant."""
    probe = CpuProbe({"client": None, **{f"{name}.{i}": p for name, pid in v.processes.items()
                                         for i, p in enumerate(tree(pid) if pid else [None])}})
    arrivals = None if rate is None else poisson(rate, random.Random(seed), n=n)
    probe.start()
    result = asyncio.run(load(v, url, texts, clients, n, arrivals, timeout_s))
    cpu = probe.stop()
    if result.errors:
        raise BenchmarkFailed(f"{v.name}: {len(result.errors)} failed requests, first: "
                              f"{result.errors[0]}")
    per = cpu_by_role(cpu, result.done)
    out = {"throughput": result.throughput, "seconds": result.seconds, "done": result.done,
           "latency_ms": pcts(result.latencies_ms), "cpu_us_per_request": per,
           "client_cpu_us_per_request": round(result.client_cpu_us_per_request, 1),
           "other_load": cpu["other_load"], **({} if rate is None else {"offered_rate": rate})}
    lat = out["latency_ms"]
    say(f"  {v.name:<10} {'closed' if rate is None else f'open {rate:6.1f}/s'}: "
        f"{out['throughput']:6.1f} req/s, p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms; "
        f"CPU us/req {per}; other load {load_str(cpu['other_load'])}")
    return out


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
    for v in (v for v in variants if v.port is not None):
        vectors = []
        for t in texts:
            request = urllib.request.Request(
                f"http://127.0.0.1:{v.port}/v1/embeddings", headers={
                    "Content-Type": "application/json"},
                data=json.dumps({"input": t, "model": MODEL}).encode())
            with urllib.request.urlopen(request, timeout=60) as response:
                vectors.append(json.loads(response.read())["data"][0]["embedding"])
        diffs[v.name] = diff = float(np.abs(np.asarray(vectors) - reference).max())
        say(f"  {v.name}: max |difference| vs the worker's vectors {diff:.2e}")
        if not diff <= EQUAL_ATOL:
            raise BenchmarkFailed(f"{v.name}: embeddings differ from inferq's by {diff:.2e} "
                                  f"(> {EQUAL_ATOL:g}): not the same computation")
    return {"texts": len(texts), "atol": EQUAL_ATOL, "max_abs_diff": diffs}


# ------------------------------------------------------------------------------ report


def figures(cfg: ServeConfig, variants: Sequence[Variant],
            trials: Mapping[str, Sequence[Mapping[str, Any]]], limit: Mapping[str, Any],
            equality: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    loads: list[float | None] = []

    def stats(passes: Sequence[Mapping[str, Any]], *keys: str) -> dict[str, Any]:
        fields = {"offered": ["offered_rate"], "throughput": ["throughput"],
                  "p50_ms": ["latency_ms", "p50"], "p99_ms": ["latency_ms", "p99"],
                  "client_cpu_us": ["client_cpu_us_per_request"]}
        return {k: summarize_trials(passes, fields[k]) for k in keys}

    for v in variants:
        ts = trials[v.name]
        closed = [t["closed"] for t in ts]
        opened = {f"{x:g}": [t["open"][f"{x:g}"] for t in ts] for x in cfg.loads}
        loads += [p["other_load"] for p in [*closed, *(p for o in opened.values() for p in o)]]
        roles = sorted({r for c in closed for r in c["cpu_us_per_request"]})
        out[v.name] = {
            "label": v.label,
            "closed": {**stats(closed, "throughput", "p50_ms", "p99_ms", "client_cpu_us"),
                       "cpu_us": {r: summarize_trials(closed, ["cpu_us_per_request", r])
                                  for r in roles}},
            "open": {k: stats(o, "offered", "throughput", "p50_ms", "p99_ms", "client_cpu_us")
                     for k, o in opened.items()},
            "trials": list(ts)}
    report: dict[str, Any] = {"variants": out, "limit": dict(limit),
                              "equality": dict(equality), "noise": noise_of(loads)}
    gateways = [v.name for v in variants if v.name.startswith("gateway") and v.name != PLAIN]
    if "litserve" in trials and gateways:
        def ratio(g: str, *path: str) -> dict[str, Any]:
            return summary([at(a, *path) / at(b, *path)
                            for a, b in zip(trials[g], trials["litserve"], strict=True)])

        best = max(gateways, key=lambda g: out[g]["closed"]["throughput"]["median"] or 0.0)
        tput, p99 = ratio(best, "closed", "throughput"), ratio(best, "closed", "latency_ms",
                                                                "p99")
        report["target"] = {
            "best_gateway": best, "ratio": tput, "p99_ratio": p99,
            "per_gateway": {g: ratio(g, "closed", "throughput") for g in gateways},
            "verdict": ("PASS" if verdict(tput["median"], TARGET_RATIO) == "PASS"
                        and (p99["median"] or 9.9) <= 1.0 else "MISS")}
    return report


def results_markdown(r: Mapping[str, Any]) -> str:
    v, lim, target = r["variants"], r["limit"], r.get("target")
    verdict_text = "" if not target else render("serve.verdict", target, per=", ".join(
        f"{g} {fmt_range(s, 2)}x" for g, s in target["per_gateway"].items()),
        target_ratio=TARGET_RATIO)
    cut = ""
    if PLAIN in v and "gateway-1" in v:
        before = v[PLAIN]["closed"]["cpu_us"].get("server", {})
        after = v["gateway-1"]["closed"]["cpu_us"].get("server", {})
        if before.get("median") and after.get("median"):
            cut = render("serve.cut", {}, before=fmt_range(before, 0),
                         after=fmt_range(after, 0), ratio=after["median"] / before["median"])
    return render(
        "serve", r, seed=CORPUS_SEED, cut=cut.rstrip("\n"), verdict_text=verdict_text,
        loads=", ".join(f"{x:.0%}" for x in r["config"]["loads"]),
        eq_text=", ".join(f"{k} {d:.1e}" for k, d in r["equality"]["max_abs_diff"].items()),
        limits=", ".join(f"bs {bs}: {rate:.1f}" for bs, rate in lim["per_batch_size"].items()),
        closed_rows=render_rows("serve.closed", ({
            **s["closed"], "label": s["label"],
            "over_limit": (s["closed"]["throughput"]["median"] or 0) / lim["limit"],
            "servers": ", ".join(f"{role} {fmt_range(stat, 0)}" for role, stat
                                 in s["closed"]["cpu_us"].items() if role != "client")}
            for s in v.values())),
        open_rows=render_rows("serve.open", ({**o, "label": s["label"], "load": float(load)}
                                             for s in v.values()
                                             for load, o in s["open"].items())))


# ------------------------------------------------------------------------------ scenario


class Serve(Scenario[ServeConfig]):
    name = "serve"
    title = "MiniLM over HTTP: inferq's gateway and SDK vs LitServe"
    quick_help = "160 requests per closed loop, 80 per open loop, 1 trial (~3 min)"
    config = ServeConfig
    markdown = staticmethod(results_markdown)

    def measure(self, run: Run[ServeConfig]) -> dict[str, Any]:
        from benchmarks.models import BareModel, minilm_path

        cfg = run.cfg
        run.machine["versions"].update({p: version(p) for p in ("litserve", "orjson",
                                                                "uvicorn", "fastapi")})
        texts = corpus.sentences(512, seed=CORPUS_SEED, min_words=MIN_WORDS,
                                 max_words=MAX_WORDS)
        say("the bare model's limit")
        bare = BareModel(minilm_path())
        bare.encode(texts[:16], 16)  # warm-up
        rates = bare.rates(texts[:cfg.limit_texts], cfg.limit_batch_sizes)
        best = max(rates, key=lambda b: rates[b])
        limit = {"per_batch_size": rates, "best_batch_size": best, "limit": rates[best]}
        del bare
        server, url = run.server()
        worker = spawn_worker(run.cleanup, url, model_arg=MODEL, worker_id="bench-serve-0",
                              log_dir=run.log_dir, flags=["--device", "cpu"])
        variants: list[Variant] = []
        skip_litserve = cfg.skip_litserve or importlib.util.find_spec("litserve") is None
        if skip_litserve and not cfg.skip_litserve:
            say("LitServe is not installed (pip install -e '.[bench]'): running without it")
        if not skip_litserve:
            child, port = litserve(run.cleanup, run.log_dir, cfg.litserve_batch,
                                   cfg.litserve_timeout_ms / 1e3)
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
            child, port = gateway(run.cleanup, url, run.log_dir, name=name, env={
                "INFERQ_GATEWAY_READY_MODEL": MODEL, **extra_env}, args=[
                "--workers", str(count), "--log-level", "warning"])
            variants.append(Variant(name, label, port, {
                "server": child.process.pid, "worker": worker.pid, "redis": server.pid}))
        variants.append(Variant("sdk", "inferq SDK (`AsyncClient`, no HTTP)", None,
                                {"worker": worker.pid, "redis": server.pid}))
        wait_registered(url, [worker])
        say("checking that every server computes the same embeddings")
        equality = check_equal(variants, url, texts[:8])
        say("warming up")
        for v in variants:
            run_pass(v, url, texts, clients=cfg.clients, n=cfg.clients, timeout_s=cfg.timeout_s)
        trials: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
        for trial, order in run.rotations(variants, lambda v: v.name):
            for v in order:
                closed = run_pass(v, url, texts, clients=cfg.clients, n=cfg.requests,
                                  timeout_s=cfg.timeout_s)
                trials[v.name].append({"closed": closed, "open": {f"{load:g}": run_pass(
                    v, url, texts, clients=cfg.clients, n=cfg.open_requests, seed=trial,
                    rate=closed["throughput"] * load, timeout_s=cfg.timeout_s)
                    for load in cfg.loads}})
        return figures(cfg, variants, trials, limit, equality)


SCENARIO = Serve()
