"""The autoscaling signal: how many workers a queue needs, ``inferq_workers_desired{queue}``.

inferq knows what a generic scaler cannot see in Redis (KEDA's Redis scaler reads list and
stream lengths only): the arrival rate, each worker's fitted batch latency ``a·n + b``, and
the backlog. From them:

* A worker that batches ``n`` requests serves ``mu(n) = n / (a·n + b)`` requests per second.
* Under load the window does not wait for arrivals: while a batch runs, the next one gathers
  (``worker.window``), so batches grow with the load, up to the batch limit ``N``. A request
  that arrives during a batch waits for it to end, so a batch must last at most the target
  wait ``T``: the batch the window settles on under the target is
  ``n_T = min(N, max(1, floor((T - b) / a)))``, and a worker's capacity is ``mu(n_T)``.
* A backlog ``B`` must drain within ``T`` on top of the arrivals: ``B / (T·mu(n_T))``
  workers.
* Utilisation is kept at ``rho`` (0.8) or below, so waits stay bounded, not just finite.

``desired = max(1, ceil(lam / (rho·mu(n_T)) + B / (T·mu(n_T))))`` while there is demand.
Scale to zero: 0 once nothing arrived, waited or ran for ``idle_s``; any request (an
arrival, a pending or running one) activates it again at once (desired >= 1). A target
shorter than one batch of one (``T < a + b``) cannot be met: the count then assumes batches
of one.

A ``generate`` queue (its workers batch continuously: no windows) is sized on tokens. Its
live workers publish a fit of their decode step ``a·n + b`` seconds at ``n`` running
sequences, their slots ``S``, their KV cache in tokens, their prefill rate ``P`` (prompt
tokens a second) and the prompt and output tokens of the requests they finished. A worker
runs ``S' = min(S, KV / (prompt + output tokens of a mean request))`` sequences at once (its
KV cache bounds the slots it can fill), decodes ``D = S' / (a·S' + b)`` tokens a second, and
so spends ``w = output / D + prompt / P`` seconds per request: its capacity is ``1 / w``
requests a second, and the demand in tokens (prompt and output tokens arriving a second:
the arrival rate times the mean request's) and the backlog (queued prompt and output tokens)
go into the formula above with it; the target wait is the time to first token the queue
keeps under (``--target-wait-ms``). Scale-down drains: a ``generate`` worker told to stop
(SIGTERM) claims nothing more, gives back what it has not started, finishes the sequences it
runs within its ``--drain-timeout-s`` and hands back the rest (their streamed tokens kept).

Where there is no fit yet (no worker ever ran a batch: a queue scaled to zero from the
start), the signal is 1 while there is demand: the first worker measures, then the signal
follows. The arrival rate is the growth of the queue's enqueue sequence (``seq``, which the
enqueue script increments per request: every shard summed) between readings on the Redis
clock, over the last ``window_s``; the tracker keeps its readings in memory (one per
exporter: a restarted exporter waits ``idle_s`` again before scaling to zero).

The target wait comes from the queue's settings (``inferq queue set TASK:MODEL
--target-wait-ms``, ``--scale-to-zero-after``); a queue without one uses the defaults
below. The signal is exported by the gateway and ``inferq dashboard`` as Prometheus text
(``/metrics/autoscale``) and as JSON for KEDA's ``metrics-api`` scaler (``/autoscale``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from inferq.plans import Plan, call
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import settings_from_hash
from inferq.stats import new_windows

DEFAULT_TARGET_WAIT_MS = 1000
DEFAULT_IDLE_S = 300.0
DEFAULT_BATCH_LIMIT = 32
#: Utilisation kept at or below this.
DEFAULT_UTILISATION = 0.8
#: The most workers the signal asks for (a bound, not a recommendation).
MAX_WORKERS = 10_000


@dataclass(frozen=True, slots=True)
class Fit:
    """Batch latency ``a·n + b`` seconds, and the batch limit ``N`` of the workers."""

    a_s: float
    b_s: float
    batch_limit: int = DEFAULT_BATCH_LIMIT

    def capacity(self, n: int) -> float:
        """Requests per second of one worker running batches of ``n``."""
        latency = self.a_s * n + self.b_s
        return math.inf if latency <= 0 else n / latency

    def batch_within(self, wait_s: float) -> int:
        """The largest batch (at most the limit, at least 1) that lasts at most ``wait_s``."""
        if self.a_s <= 0:
            return self.batch_limit if self.b_s <= wait_s else 1
        return max(1, min(self.batch_limit, math.floor((wait_s - self.b_s) / self.a_s)))


@dataclass(frozen=True, slots=True)
class TokenFit:
    """What a queue's continuous-batching (``generate``) workers measured, averaged: decode
    step ``a·n + b`` seconds, slots, KV cache tokens (None: unknown), prefill tokens a second
    (None: none measured) and the mean finished request's prompt and output tokens."""

    decode_a_s: float
    decode_b_s: float
    slots: int
    prompt_tokens: float
    output_tokens: float
    prefill_per_s: float | None = None
    kv_tokens: int | None = None

    def running(self) -> int:
        """The sequences a worker runs at once: its slots, or fewer when its KV cache cannot
        hold that many mean requests."""
        size = self.prompt_tokens + self.output_tokens
        if self.kv_tokens is None or size <= 0:
            return self.slots
        return max(1, min(self.slots, math.floor(self.kv_tokens / size)))

    def decode_per_s(self) -> float:
        """Tokens a second one worker decodes with ``running`` sequences."""
        n = self.running()
        step = self.decode_a_s * n + self.decode_b_s
        return math.inf if step <= 0 else n / step

    def capacity(self) -> float:
        """Requests a second one worker serves: 1 / its seconds per request (output tokens at
        its decode rate, prompt tokens at its prefill rate)."""
        seconds = self.output_tokens / self.decode_per_s()
        if self.prefill_per_s:
            seconds += self.prompt_tokens / self.prefill_per_s
        return math.inf if seconds <= 0 else 1 / seconds


@dataclass(frozen=True, slots=True)
class Demand:
    #: Arrivals per second.
    arrival_rate: float
    #: Requests waiting: pending plus delayed retries.
    backlog: int
    inflight: int = 0
    #: Seconds since anything arrived, waited or ran (for scale to zero).
    idle_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Target:
    wait_s: float = DEFAULT_TARGET_WAIT_MS / 1000
    #: Scale to zero after this long idle (None: never below one worker).
    idle_s: float | None = DEFAULT_IDLE_S
    utilisation: float = DEFAULT_UTILISATION


def desired_workers(demand: Demand, fit: Fit | TokenFit | None, target: Target) -> int:
    """The workers ``demand`` needs under ``target`` (see the module docstring)."""
    busy = demand.arrival_rate > 0 or demand.backlog > 0 or demand.inflight > 0
    if not busy and target.idle_s is not None and demand.idle_s >= target.idle_s:
        return 0
    if fit is None:
        return 1
    capacity = (fit.capacity() if isinstance(fit, TokenFit)
                else fit.capacity(fit.batch_within(target.wait_s)))
    need = (demand.arrival_rate / (target.utilisation * capacity)
            + demand.backlog / (target.wait_s * capacity))
    # a hair under an integer is that integer (float noise must not add a worker)
    return int(min(MAX_WORKERS, max(1, math.ceil(need - 1e-9))))


@dataclass
class Signal:
    """One queue's signal, with what it was computed from."""

    queue: str
    desired: int
    live_workers: int
    arrival_rate: float
    backlog: int
    inflight: int
    idle_s: float
    target_wait_ms: float
    scale_to_zero_after_s: float | None
    fit: dict[str, float | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_from_windows(windows: list[dict[str, Any]]) -> Fit | None:
    """The mean fit of the live workers that ran batches (their published windows)."""
    fits = []
    for w in windows:
        try:
            a, b = float(w["latency_a_ms"]) / 1000, float(w["latency_b_ms"]) / 1000
            batches = int(w.get("batches", 0))
            limit = int(w.get("batch_limit", DEFAULT_BATCH_LIMIT))
        except (KeyError, TypeError, ValueError):
            continue
        if batches > 0 and a >= 0 and b >= 0 and a + b > 0 and limit >= 1:
            fits.append((a, b, limit))
    if not fits:
        return None
    return Fit(sum(f[0] for f in fits) / len(fits), sum(f[1] for f in fits) / len(fits),
               max(f[2] for f in fits))


def token_fit_from_windows(windows: list[dict[str, Any]]) -> TokenFit | None:
    """The mean token fit of the live continuous-batching workers that decoded and finished
    requests (their published fields)."""
    fits, requests, prompt, output = [], 0, 0, 0
    for w in windows:
        if w.get("mode") != "continuous":
            continue
        try:
            a, b = float(w["decode_a_ms"]) / 1000, float(w["decode_b_ms"]) / 1000
            slots, done = int(w["max_slots"]), int(w.get("requests", 0))
            kv = int(w["kv_tokens"]) if w.get("kv_tokens") else None
            prefill = float(w["prefill_tokens_per_s"]) if w.get("prefill_tokens_per_s") else None
            tokens, prefilled = int(w.get("tokens", 0)), int(w.get("prefill_tokens", 0))
        except (KeyError, TypeError, ValueError):
            continue
        if a >= 0 and b >= 0 and a + b > 0 and slots >= 1:
            fits.append((a, b, slots, kv, prefill))
            requests, prompt, output = requests + done, prompt + prefilled, output + tokens
    if not fits or requests <= 0:
        return None
    kvs = [f[3] for f in fits if f[3] is not None]
    rates = [f[4] for f in fits if f[4] is not None and f[4] > 0]
    return TokenFit(sum(f[0] for f in fits) / len(fits), sum(f[1] for f in fits) / len(fits),
                    round(sum(f[2] for f in fits) / len(fits)), prompt / requests,
                    output / requests, sum(rates) / len(rates) if rates else None,
                    round(sum(kvs) / len(kvs)) if kvs else None)


@dataclass
class _Readings:
    """A queue's (time, seq) readings over the window, its last fit and last activity."""

    samples: deque[tuple[float, int]] = field(default_factory=deque)
    fit: Fit | TokenFit | None = None
    active_at: float | None = None


class Tracker:
    """Reads each queue's demand and computes its signal; keeps the readings the rate and the
    idle time need (call ``read`` every few seconds: the exporter's scrapes do)."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._queues: dict[str, _Readings] = {}

    def observe(self, queue: str, now_s: float, seq: int, backlog: int, inflight: int,
                fit: Fit | TokenFit | None) -> tuple[float, float]:
        """Record one reading; (arrival rate, idle seconds)."""
        state = self._queues.setdefault(queue, _Readings())
        if fit is not None:
            state.fit = fit
        samples = state.samples
        if samples and seq < samples[-1][1]:  # the counter was reset: start again
            samples.clear()
        grew = bool(samples) and seq > samples[-1][1]
        samples.append((now_s, seq))
        while len(samples) > 2 and samples[1][0] <= now_s - self.window_s:
            samples.popleft()
        first_t, first_seq = samples[0]
        rate = (seq - first_seq) / (now_s - first_t) if now_s > first_t else 0.0
        if state.active_at is None or grew or backlog > 0 or inflight > 0:
            state.active_at = now_s
        return rate, now_s - state.active_at

    def fit(self, queue: str) -> Fit | TokenFit | None:
        state = self._queues.get(queue)
        return state.fit if state else None

    def read(self, keys: QueueKeys) -> Plan[Signal]:
        """One queue's signal: its settings, every shard's counts and live workers' windows."""
        (raw,) = yield [call("hgetall", keys.for_shard(0).config)]
        settings = settings_from_hash(raw)
        target = Target(wait_s=(settings.target_wait_ms or DEFAULT_TARGET_WAIT_MS) / 1000,
                        idle_s=settings.scale_to_zero_after_s or DEFAULT_IDLE_S)
        shards = keys.for_shard(0).shards(settings.claim_shards)
        (now,) = yield [call("execute_command", "TIME")]
        now_s = int(now[0]) + int(now[1]) / 1e6
        seq = backlog = inflight = 0
        workers: set[str] = set()
        windows: list[dict[str, Any]] = []
        for shard in shards:
            s, pending, delayed, running = yield [
                call("get", shard.seq), call("zcard", shard.pending),
                call("zcard", shard.delayed), call("zcard", shard.inflight)]
            seq += int(s or 0)
            backlog += int(pending) + int(delayed)
            inflight += int(running)
            windows += yield from new_windows(shard, now, workers)
        rate, idle = self.observe(keys.queue, now_s, seq, backlog, inflight,
                                  token_fit_from_windows(windows) or fit_from_windows(windows))
        fit = self.fit(keys.queue)
        desired = desired_workers(Demand(rate, backlog, inflight, idle), fit, target)
        return Signal(keys.queue, desired, len(workers), round(rate, 3), backlog, inflight,
                      round(idle, 3), target.wait_s * 1000, target.idle_s,
                      _fit_fields(fit))


def _fit_fields(fit: Fit | TokenFit | None) -> dict[str, float | None] | None:
    if isinstance(fit, TokenFit):
        return {"decode_a_ms": fit.decode_a_s * 1000, "decode_b_ms": fit.decode_b_s * 1000,
                "slots": fit.slots, "running": fit.running(),
                "decode_tokens_per_s": fit.decode_per_s(), "prefill_tokens_per_s":
                fit.prefill_per_s, "prompt_tokens": fit.prompt_tokens,
                "output_tokens": fit.output_tokens, "requests_per_s": fit.capacity()}
    if fit is None:
        return None
    return {"a_ms": fit.a_s * 1000, "b_ms": fit.b_s * 1000, "batch_limit": fit.batch_limit}


def prometheus_text(signals: list[Signal]) -> str:
    """The signals in Prometheus' text format (the exporter has no prometheus_client: the
    gateway's light install)."""
    lines = ["# HELP inferq_workers_desired Workers needed to keep queue wait under the "
             "queue's target (inferq queue set --target-wait-ms).",
             "# TYPE inferq_workers_desired gauge"]
    lines += [f'inferq_workers_desired{{queue="{s.queue}"}} {s.desired}' for s in signals]
    lines += ["# HELP inferq_arrival_rate Requests enqueued per second (recent window).",
              "# TYPE inferq_arrival_rate gauge"]
    lines += [f'inferq_arrival_rate{{queue="{s.queue}"}} {s.arrival_rate}' for s in signals]
    return "\n".join(lines) + "\n"
