"""Scenario ``tenants``: what the front door costs. One gateway process authenticates every
call by the operator's single token; another, over the same Redis and worker, by tenant API
keys looked up in Redis, with per-tenant rate limits (requests/min, tokens/min, in flight:
one admission script before each request and one settlement after it) and tenant-scoped
request ids. Same closed loop, the variants alternating by trial; target: the keyed
gateway's requests/s within 5 % of the single token's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from benchmarks.framework import ByMode, Run, Scenario, flag, render, render_rows
from benchmarks.harness import CpuProbe, positive_int, say, summary, verdict
from benchmarks.loadgen import HttpPool, closed_loop
from benchmarks.stack import gateway, spawn_workers, window_flags
from inferq.tenancy import KeyStore

TARGET_RATIO = 0.95
MODEL = "echo"
OPERATOR_TOKEN = "bench-operator-token"
#: High enough never to refuse in the run, so each call pays the full admission and settlement.
LIMITS = {"requests_per_minute": 100_000_000, "tokens_per_minute": 1_000_000_000,
          "max_in_flight": 100_000, "max_priority": 10}


@dataclass(frozen=True)
class TenantsConfig:
    requests: int = flag(positive_int, ByMode(4_000, 300), "answered calls per variant and trial")
    clients: int = flag(positive_int, 32, "concurrent clients of the closed loop")
    tenants: int = flag(positive_int, 8, "tenant keys the clients take turns with")


def raw_call(port: int, secret: str, i: int) -> bytes:
    body = json.dumps({"prompt": f"tenant call {i}", "model": MODEL}).encode()
    head = ["POST /v1/requests?wait=true HTTP/1.1", f"Host: 127.0.0.1:{port}",
            "Content-Type: application/json", f"Authorization: Bearer {secret}",
            f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def one_pass(port: int, secrets: Sequence[str], cfg: TenantsConfig) -> Any:
    raws = [raw_call(port, secrets[i % len(secrets)], i) for i in range(4 * len(secrets))]
    pool = await HttpPool("127.0.0.1", port, raws).connect(cfg.clients)
    try:
        return await closed_loop([pool.call] * cfg.clients, cfg.requests)
    finally:
        pool.close()


def results_markdown(r: Mapping[str, Any]) -> str:
    return render("tenants", r, rows=render_rows("tenants.row", (
        {"name": name, **v} for name, v in r["variants"].items())))


class Tenants(Scenario[TenantsConfig]):
    name = "tenants"
    title = "the gateway's requests/s with tenant keys, limits and ownership vs one token"
    quick_help = "300 calls per variant, one trial (~30 s)"
    config = TenantsConfig
    trials = (3, 1)
    markdown = staticmethod(results_markdown)

    def measure(self, run: Run[TenantsConfig]) -> dict[str, Any]:
        cfg = run.cfg
        _, url = run.server()
        with redis.Redis.from_url(url) as r:
            store = KeyStore(r)
            keys = [store.create(f"tenant-{i}", **LIMITS).secret for i in range(cfg.tenants)]
            plain = [store.create(f"plain-{i}").secret for i in range(cfg.tenants)]
        spawn_workers(run.cleanup, url, ["w1"], model_arg=f"{MODEL}=builtin:echo",
                      log_dir=run.log_dir, flags=window_flags(64, 2.0))
        token_gw, token_port = gateway(run.cleanup, url, run.log_dir, name="gateway-token",
                                       env={"INFERQ_GATEWAY_TOKEN": OPERATOR_TOKEN})
        keyed_gw, keyed_port = gateway(run.cleanup, url, run.log_dir, name="gateway-keys")
        variants = {"single token": (token_gw, token_port, [OPERATOR_TOKEN]),
                    "tenant keys (auth, ownership)": (keyed_gw, keyed_port, plain),
                    "tenant keys + limits": (keyed_gw, keyed_port, keys)}
        for _, port, secrets in variants.values():  # warm: imports, pools, key caches
            asyncio.run(one_pass(port, secrets, TenantsConfig(200, cfg.clients, cfg.tenants)))
        rates: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        p50: dict[str, list[float]] = {name: [] for name in variants}
        for _, order in run.rotations(list(variants)):
            for name in order:
                child, port, secrets = variants[name]
                probe = CpuProbe({"gateway": child.process.pid})
                probe.start()
                result = asyncio.run(one_pass(port, secrets, cfg))
                used = probe.stop()
                if result.errors:
                    raise RuntimeError(f"{name}: {len(result.errors)} failed calls, e.g. "
                                       f"{result.errors[0]}")
                rates[name].append(result.throughput)
                cpu[name].append((used["gateway"] or 0.0) / result.done * 1e6)
                p50[name].append(sorted(result.latencies_ms)[len(result.latencies_ms) // 2])
                say(f"  {name}: {result.throughput:.0f} req/s, gateway "
                    f"{cpu[name][-1]:.0f} us CPU per call")
        out = {name: {"rate": summary(rates[name]), "cpu_us": summary(cpu[name]),
                      "p50_ms": summary(p50[name])} for name in variants}
        ratio = summary([k / t for k, t in zip(rates["tenant keys + limits"],
                                               rates["single token"], strict=True)])
        keys_only = summary([k / t for k, t in zip(rates["tenant keys (auth, ownership)"],
                                                   rates["single token"], strict=True)])
        return {"variants": out, "ratio": ratio, "keys_ratio": keys_only,
                "target": TARGET_RATIO, "verdict": verdict(ratio["median"], TARGET_RATIO),
                "keys_verdict": verdict(keys_only["median"], TARGET_RATIO)}


SCENARIO = Tenants()
