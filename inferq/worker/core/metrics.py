"""Prometheus metrics and the health endpoint of one worker.

Every metric is named ``inferq_*`` and labelled with the queue (``task:model``); the names are
the contract the Grafana dashboard and the Prometheus config in ``deploy/`` rely on (a test
checks they match). Each worker has its own registry, served on ``--metrics-port`` together
with ``/healthz``.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.exposition import choose_encoder

from inferq.plans import run_async
from inferq.protocol import slo
from inferq.stats import sharded_queue_stats

if TYPE_CHECKING:
    from redis import asyncio as aioredis

    from inferq.protocol.keys import QueueKeys
    from inferq.worker.core.results import Claim

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
FORWARD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Queue waits kept for the published p50/p99.
RECENT_WAITS = 2048
RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class WorkerMetrics:
    def __init__(self, queue: str, worker_id: str) -> None:
        self.queue = queue
        #: Where the device memory gauges come from when the model lives in another process
        #: (the generate worker's engine process): () -> (allocated, reserved) bytes.
        self.device_memory_source: Callable[[], tuple[int, int]] | None = None
        #: The generate worker's engine statistics: () -> (KV cache usage 0..1, requests the
        #: engine preempted itself); set with ``--engine vllm`` (vLLM's own stats).
        self.engine_stats_source: Callable[[], tuple[float, int]] | None = None
        #: The queue waits (s) of the last requests this worker finished, for the p50/p99 it
        #: publishes in its window hash (the dashboard reads them without Prometheus).
        self.recent_waits: deque[float] = deque(maxlen=RECENT_WAITS)
        #: The last CUDA memory sample (allocated, reserved bytes), for the dashboard.
        self.last_device_memory: tuple[int, int] | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        q = ["queue"]
        self.queue_depth = Gauge("inferq_queue_depth", "Pending requests by priority",
                                 ["queue", "priority"], registry=r)
        self.inflight = Gauge("inferq_inflight", "Requests under lease (all workers)", q,
                              registry=r)
        self.dead_letter_depth = Gauge("inferq_dead_letter_depth",
                                       "Requests in the capped dead-letter set", q, registry=r)
        self.live_workers = Gauge("inferq_live_workers", "Workers with a current heartbeat", q,
                                  registry=r)
        self.claim_to_result = Histogram(
            "inferq_claim_to_result_seconds", "From claim to result written, by priority",
            ["queue", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "inferq_queue_wait_seconds", "From enqueue to claim, by priority",
            ["queue", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("inferq_batch_size", "Requests per batch", q,
                                    buckets=SIZE_BUCKETS, registry=r)
        self.batch_fill = Histogram("inferq_batch_fill_ratio",
                                    "Batch size / max batch size", q, buckets=RATIO_BUCKETS,
                                    registry=r)
        self.padding = Histogram("inferq_padding_efficiency",
                                 "Real tokens / padded tokens per batch", q,
                                 buckets=RATIO_BUCKETS, registry=r)
        self.releases = Counter("inferq_batch_releases_total",
                                "Batches released, by why the window closed",
                                ["queue", "reason"], registry=r)
        self.window = Gauge("inferq_window_seconds", "Current adaptive batch window", q,
                            registry=r)
        self.target_batch = Gauge("inferq_target_batch_size",
                                  "Batch size the window currently aims for", q, registry=r)
        self.tokens = Counter("inferq_tokens_total", "Real (unpadded) tokens processed", q,
                              registry=r)
        self.forward = Histogram("inferq_forward_seconds", "Model forward time per batch", q,
                                 buckets=FORWARD_BUCKETS, registry=r)
        self.requests = Counter("inferq_requests_total",
                                "Requests finished by this worker, by outcome",
                                ["queue", "status"], registry=r)
        self.slo_met = Counter("inferq_slo_met_total",
                               "Finished requests with a latency objective (ttft_slo_ms), by "
                               "whether they met it (goodput)", ["queue", "met"], registry=r)
        self.slo_ratio = Histogram(
            "inferq_slo_prediction_ratio",
            "Requests admission by prediction admitted: actual time to their result (first "
            "token) over the predicted time", q, buckets=slo.RATIO_BUCKETS, registry=r)
        self.retries = Counter("inferq_retries_total", "Requests sent back for a retry", q,
                               registry=r)
        self.reclaims = Counter("inferq_reclaims_total",
                                "Expired leases returned to pending by this worker", q,
                                registry=r)
        self.dead_letters = Counter("inferq_dead_letters_total",
                                    "Requests dead-lettered (by this worker)", q, registry=r)
        self.expirations = Counter("inferq_expired_total",
                                   "Requests answered expired without running", q, registry=r)
        self.oom_splits = Counter("inferq_oom_splits_total",
                                  "Batches split after running out of device memory", q,
                                  registry=r)
        self.preemptions = Counter(
            "inferq_preemptions_total",
            "Work pushed aside for higher priority: reason=priority, running generations that "
            "yielded their slot (they resume later); reason=window_swap, requests of a "
            "pre-claimed window given back for higher-priority ones",
            ["queue", "reason"], registry=r)
        self.garbage = Counter("inferq_garbage_dropped_total",
                               "Raw queue keys dropped by this worker's scripts: nothing tied "
                               "them to a request (e.g. a pending id without its hash)", q,
                               registry=r)
        self.corrupt = Counter("inferq_corrupt_requests_total",
                               "Requests answered corrupt_request: their stored fields were "
                               "damaged", q, registry=r)
        self.refused = Counter("inferq_refused_completions_total",
                               "Completions refused (lease lost, cancelled)", q, registry=r)
        self.device_memory = Gauge("inferq_device_memory_bytes",
                                   "CUDA memory in use (allocated) and reserved by torch",
                                   ["queue", "kind"], registry=r)
        self.kv_cache_usage = Gauge("inferq_kv_cache_usage_ratio",
                                    "KV cache blocks in use, 0..1 (--engine vllm: vLLM's)",
                                    q, registry=r)
        self.engine_preemptions = Gauge(
            "inferq_engine_preemptions",
            "Requests the engine preempted itself for lack of KV cache since it started "
            "(--engine vllm: vLLM's count; inferq's priority preemptions are "
            "inferq_preemptions_total)", q, registry=r)
        self.running = Gauge("inferq_running_sequences",
                             "generate: sequences in the running batch", q, registry=r)
        self.generated_tokens = Counter("inferq_generated_tokens_total",
                                        "generate: tokens generated (decoded)", q, registry=r)
        self.ttft = Histogram("inferq_time_to_first_token_seconds",
                              "generate: from enqueue to the first text in the stream",
                              ["queue", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        # Cache affinity (``inferq.worker.generate.affinity``): also kept as plain counts
        # for the window hash (``inferq stats``).
        self.claims_total = 0
        self.affinity_claims_total = 0
        self.claimed = Counter("inferq_claimed_total", "Requests this worker claimed", q,
                               registry=r)
        self.affinity_claimed = Counter(
            "inferq_affinity_claimed_total", "Requests claimed by cache-affinity preference "
            "(the worker held their prefix or session): ÷ inferq_claimed_total is the share",
            q, registry=r)
        self.prefix_prompt_tokens = Gauge(
            "inferq_prefix_cache_prompt_tokens", "generate: prompt tokens the engine admitted "
            "since it started (with its prefix cache on)", q, registry=r)
        self.prefix_reused_tokens = Gauge(
            "inferq_prefix_cache_reused_tokens", "generate: of those, tokens taken from the "
            "prefix cache instead of computed (tokens saved; ÷ prompt tokens: the hit rate)",
            q, registry=r)
        # Fair shares (``inferq.protocol.fair``): the tenant label is bounded, see ``tenant_label``.
        tenant = ["queue", "tenant"]
        self.tenant_depth = Gauge(
            "inferq_tenant_depth", "Unfinished requests (waiting, running or retrying) per "
            "tenant (named tenants; the others summed as other)", tenant, registry=r)
        self.tenant_wait = Histogram(
            "inferq_tenant_queue_wait_seconds", "From enqueue to claim, by tenant", tenant,
            buckets=LATENCY_BUCKETS, registry=r)
        self.tenant_cost = Counter(
            "inferq_tenant_cost_total", "Cost served (the fair-share token estimate) by "
            "tenant: its rate is the tenant's served cost per second", tenant, registry=r)
        #: The tenants the queue's settings name: the only ones with a label of their own.
        self.tenants: frozenset[str] = frozenset()
        self.info = Gauge("inferq_worker_info", "Constant 1, labelled with the worker's id",
                          ["queue", "worker"], registry=r)
        self.info.labels(queue, worker_id).set(1)
        for gauge in (self.inflight, self.dead_letter_depth, self.live_workers, self.window,
                      self.target_batch, self.running):
            gauge.labels(queue).set(0)

    def names(self) -> set[str]:
        """Every sample name this registry can export, labelled children or not yet (for
        checking dashboards and alerts against what is exported)."""
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "gauge": ("",)}
        return {metric.name + suffix for metric in self.registry.collect()
                for suffix in suffixes.get(metric.type, ("",))}

    def render(self, accept: str = "") -> tuple[str, bytes]:
        """The exposition a scraper's ``Accept`` header asks for (prometheus_client's own
        negotiation): OpenMetrics, which carries the latency histograms' exemplars (trace ids),
        to a Prometheus that asks for it; else the text format."""
        encoder, content_type = choose_encoder(accept)
        return content_type, encoder(self.registry)

    async def sample_queue(self, client: aioredis.Redis, keys: QueueKeys, device: str) -> None:
        """Queue-wide gauges (depth by priority, in flight, dead letters, live workers), and
        torch's CUDA memory on a GPU worker. A sharded queue's gauges sum every shard."""
        sample = await run_async(client, sharded_queue_stats(keys, detail=False))
        q = self.queue
        self.queue_depth.clear()
        for priority, count in sample.pending_by_priority.items():
            self.queue_depth.labels(q, str(priority)).set(count)
        self.inflight.labels(q).set(sample.inflight)
        self.dead_letter_depth.labels(q).set(sample.dead_lettered)
        self.live_workers.labels(q).set(len(sample.live_workers))
        self.tenant_depth.clear()
        depths: dict[str, int] = {}
        for tenant, count in sample.tenants.items():
            label = self.tenant_label(tenant)
            depths[label] = depths.get(label, 0) + count
        for label, count in depths.items():
            self.tenant_depth.labels(q, label).set(count)
        if self.engine_stats_source is not None:
            usage, preempted = self.engine_stats_source()
            self.kv_cache_usage.labels(q).set(usage)
            self.engine_preemptions.labels(q).set(preempted)
        if self.device_memory_source is not None:
            allocated, reserved = self.device_memory_source()
        elif device.startswith("cuda"):
            import torch

            allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        else:
            return
        self.last_device_memory = (int(allocated), int(reserved))
        self.device_memory.labels(q, "allocated").set(allocated)
        self.device_memory.labels(q, "reserved").set(reserved)

    def tenant_label(self, tenant: str | None) -> str:
        """A tenant's metric label: its name when the queue's settings name it (a weight or a
        limit), else ``other`` (requests without a tenant too), so the label's values stay as
        few as the operator's list."""
        return tenant if tenant is not None and tenant in self.tenants else "other"

    def observe_tenants(self, claims: Iterable[Claim]) -> None:
        """Queue wait and served cost per tenant label, of requests that finished."""
        waits: dict[str, list[float]] = {}
        costs: dict[str, int] = {}
        for claim in claims:
            label = self.tenant_label(claim.payload.tenant)
            waits.setdefault(label, []).append(
                max(claim.claimed_ms - claim.claimed.enqueued_ms, 0) / 1e3)
            costs[label] = costs.get(label, 0) + claim.payload.fair_cost
        for label, values in waits.items():
            observe_many(self.tenant_wait.labels(self.queue, label), values)
            self.tenant_cost.labels(self.queue, label).inc(costs[label])

    def count_claims(self, claimed: int, preferred: int) -> None:
        self.claims_total += claimed
        self.affinity_claims_total += preferred
        if claimed:
            self.claimed.labels(self.queue).inc(claimed)
        if preferred:
            self.affinity_claimed.labels(self.queue).inc(preferred)

    def count_expired(self, requests: int) -> None:
        """Requests the claim script answered ``expired`` (deadline passed while pending)."""
        self.requests.labels(self.queue, "expired").inc(requests)
        self.expirations.labels(self.queue).inc(requests)

    def observe_batch(self, size: int, max_size: int, forward_s: float, tokens: int) -> None:
        """One batch (window worker) or decode step (generate worker) the model ran."""
        q = self.queue
        self.batch_size.labels(q).observe(size)
        self.batch_fill.labels(q).observe(size / max_size)
        self.forward.labels(q).observe(forward_s)
        self.tokens.labels(q).inc(tokens)

    def observe_latency(self, claim: Claim, finished_ms: int) -> None:
        """Time in the queue and from claim to result, of a request that finished (with its
        trace as the exemplar, when it carries a sampled one)."""
        self._observe_latency(claim, finished_ms)
        self.observe_tenants((claim,))

    def _observe_latency(self, claim: Claim, finished_ms: int) -> None:
        priority = str(claim.payload.priority)
        wait = max(claim.claimed_ms - claim.claimed.enqueued_ms, 0) / 1e3
        self.recent_waits.append(wait)
        exemplar = exemplar_of(claim)
        self.queue_wait.labels(self.queue, priority).observe(wait, exemplar)
        self.claim_to_result.labels(self.queue, priority).observe(
            max(finished_ms - claim.claimed_ms, 0) / 1e3, exemplar)

    def observe_latencies(self, claims: Iterable[Claim], finished_ms: int) -> None:
        """``observe_latency`` for requests that finished together (a batch): each histogram
        child is looked up once per priority and fed all its values at once."""
        claims = list(claims)
        waits: dict[int, list[float]] = {}
        runs: dict[int, list[float]] = {}
        #: Per priority, one traced request observed with its trace as the exemplar.
        traced: dict[int, Claim] = {}
        for claim in claims:
            priority = claim.payload.priority
            if priority not in waits:
                waits[priority], runs[priority] = [], []
            if claim.payload.traceparent is not None and priority not in traced \
                    and exemplar_of(claim) is not None:
                traced[priority] = claim
                continue
            waits[priority].append(max(claim.claimed_ms - claim.claimed.enqueued_ms, 0) / 1e3)
            runs[priority].append(max(finished_ms - claim.claimed_ms, 0) / 1e3)
        for priority, values in waits.items():
            self.recent_waits.extend(values)
            observe_many(self.queue_wait.labels(self.queue, str(priority)), values)
            observe_many(self.claim_to_result.labels(self.queue, str(priority)), runs[priority])
        for claim in traced.values():
            self._observe_latency(claim, finished_ms)
        self.observe_tenants(claims)

    def dashboard_fields(self) -> dict[str, str]:
        """For the worker's window hash (the dashboard reads it): p50 and p99 of the recent
        queue waits (ms) and the last CUDA memory sample (MiB), those it has."""
        fields: dict[str, str] = {}
        if self.last_device_memory is not None:
            allocated, reserved = self.last_device_memory
            fields.update(device_memory_mb=f"{allocated / 2**20:.0f}",
                          device_reserved_mb=f"{reserved / 2**20:.0f}")
        if not self.recent_waits:
            return fields
        ordered = sorted(self.recent_waits)

        def at(q: float) -> str:
            return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3:.1f}"

        return {**fields, "wait_p50_ms": at(0.50), "wait_p99_ms": at(0.99),
                "wait_samples": str(len(ordered))}

    def observe_outcome(self, status: str, written: bool, count: int = 1) -> None:
        """``count`` completions the worker sent with this status: counted by what the server
        did with them."""
        q = self.queue
        if not written:
            self.refused.labels(q).inc(count)
        elif status == "retry":
            self.retries.labels(q).inc(count)
        else:
            self.requests.labels(q, status).inc(count)
            if status == "dead":
                self.dead_letters.labels(q).inc(count)
            elif status == "expired":
                self.expirations.labels(q).inc(count)


def exemplar_of(claim: Claim) -> dict[str, str] | None:
    """The exemplar of a request's latencies: its trace id, when its trace was sampled (an
    unsampled one has no spans to find). Prometheus reads exemplars in the OpenMetrics format
    (``serve`` answers it to a scraper that asks)."""
    traceparent = claim.payload.traceparent
    if traceparent is None or not int(traceparent[-2:], 16) & 1:
        return None
    return {"trace_id": traceparent[3:35]}


def observe_many(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for each value, with one lock round per bucket instead of two per
    value: counts per bucket (``le`` is inclusive, as in ``observe``) and the sum, added once.
    Falls back to ``observe`` on a client whose histogram children look different."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if (bounds is None or buckets is None or total is None or len(bounds) != len(buckets)
            or bounds[-1] != math.inf):
        for value in values:
            child.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    total.inc(math.fsum(values))
    for bucket, n in zip(buckets, counts, strict=True):
        if n:
            bucket.inc(n)


class HealthState:
    """What ``/healthz`` reports: the event loop ticks and Redis answered recently."""

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self._last_ok = time.monotonic()
        self._detail: dict[str, Any] = {"status": "starting"}
        self._stopping = False
        self._lock = threading.Lock()

    def stopping(self) -> None:
        """A stop was asked for: the worker claims nothing more and drains (``/healthz``
        says ``"stopping": true`` from now on)."""
        with self._lock:
            self._stopping = True

    def ok(self, **detail: Any) -> None:
        with self._lock:
            self._last_ok = time.monotonic()
            self._detail = {"status": "ok", **detail}

    def failing(self, reason: str) -> None:
        with self._lock:
            self._detail = {**self._detail, "status": "degraded", "reason": reason}

    def report(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            age = time.monotonic() - self._last_ok
            healthy = age <= self.stale_after_s and self._detail.get("status") == "ok"
            stopping = {"stopping": True} if self._stopping else {}
            return healthy, {**self._detail, **stopping, "seconds_since_ok": round(age, 3)}


def serve(metrics: WorkerMetrics, health: HealthState, port: int,
          host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` on a daemon thread; ``port`` 0 picks a free one."""
    routes: dict[str, Callable[[str], tuple[int, str, bytes]]] = {
        "/metrics": lambda accept: (200, *metrics.render(accept)),
        "/healthz": lambda _: _health(health),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            status, ctype, body = (route(self.headers.get("Accept", "")) if route
                                   else (404, "text/plain", b"not found\n"))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # scrapes every few seconds would flood the worker's log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="inferq-metrics", daemon=True).start()
    return server


def _health(health: HealthState) -> tuple[int, str, bytes]:
    healthy, detail = health.report()
    return (200 if healthy else 503), "application/json", json.dumps(detail).encode()
