"""Every Redis call a worker makes on its queue, but the heartbeat's (``leases``) and the
wake-up BLPOP (``wake``, whose lists ``follow_shards`` keeps on every shard): claims, starts,
completions, releases and a generating worker's stream writes (``publish``), each one script
call per shard of the leases concerned (``_per_shard``; several in one round trip:
``ScriptPipeline``), the queue registry, the priority check of a pre-claimed window, the window
tuning, the stats hash, and the maintenance loop (reclaims, health).

Writes that follow a forward (results, stream text) are retried through a Redis outage for as
long as the leases they carry can still be valid (``until_leases_expire``). After that the
requests are reclaimed by the queue and run again elsewhere, so giving up loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisError, ResponseError

from inferq import cluster, plans
from inferq.protocol import ops, scores
from inferq.protocol.keys import QueueKeys, queues_registry
from inferq.protocol.settings import QueueSettings, settings_from_hash
from inferq.worker.core.backoff import RedisBackoff
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.leases import LeaseBook
from inferq.worker.core.liveness import LivenessProbe
from inferq.worker.core.metrics import HealthState, WorkerMetrics
from inferq.worker.core.traces import WorkerTraces
from inferq.worker.core.wake import WakeWaiter

log = logging.getLogger("inferq.worker")

#: Expired leases one RECLAIM call moves back to pending (or to the dead letters).
RECLAIM_BATCH = 500
#: Lifetime of a worker's stats hash (``inferq stats``): it vanishes soon after the worker.
WINDOW_STATS_TTL_MS = 15_000
#: Lifetime of the persisted window tuning of a (queue, model).
TUNING_TTL_S = 7 * 24 * 3600
#: How often the queue's settings (its shard count) are read again.
SETTINGS_REFRESH_S = 1.0
#: Shards a claim round of a sharded queue peeks at, from a turn that moves by this much each
#: round; the next ones are peeked only when these hold nothing to claim. So a queue of 256
#: shards costs 8 PEEKs per busy round, not 256, and a request of a better priority waits at
#: most ceil(S / PEEK_SHARDS) - 1 rounds of a worker behind worse ones (docs/guides/scaling-out.md,
#: "Sharded queues").
PEEK_SHARDS = 8

T = TypeVar("T")


def band_top(priority: int) -> int:
    """The highest pending score of ``priority`` (every request of that priority or higher
    scores at most this)."""
    return scores.band(priority) + scores.SEQ_LIMIT - 1


class QueueLink:
    def __init__(self, config: WorkerConfig, keys: QueueKeys, book: LeaseBook,
                 metrics: WorkerMetrics, clock: Callable[[], float]) -> None:
        self.config = config
        self.keys = keys
        self.book = book
        self.metrics = metrics
        self.clock = clock
        #: Redis time minus our monotonic clock, from the last claim.
        self.clock_offset_s = 0.0
        self.redis: Any = None
        self.scripts: Mapping[str, Any] = {}
        #: The queue's settings (``config`` hash), read at the first claim and about every
        #: second after: a sharded queue is claimed from every shard it has had.
        self.settings = QueueSettings()
        #: The cache-affinity mode and max wait of the next claims ('', 0: none), as the
        #: worker decides them (``inferq.worker.generate.affinity``).
        self.affinity: Callable[[], tuple[str, int]] | None = None
        self._settings_read_at: float | None = None
        #: Which shard a sharded claim round starts with: it moves one shard per round, so
        #: every shard of the best band is drained at the same pace (fair shares hold per
        #: shard, and so across shards; see docs/guides/fair-sharing.md).
        self._shard_turn = 0
        #: The same for the head reads of ``head_priority``.
        self._head_turn = 0
        #: The requests' spans (``core.traces``), None while tracing is off.
        self.traces: WorkerTraces | None = None
        #: Lists the connected workers for the reclaim sweep (made in ``attach``).
        self.liveness = LivenessProbe(cluster=False)

    def attach(self, redis: Any, scripts: Mapping[str, Any]) -> None:
        """The connection and registered scripts to use (made in the worker's event loop)."""
        self.redis = redis
        self.scripts = scripts
        self.liveness = LivenessProbe(cluster=isinstance(redis, AsyncRedisCluster))

    def to_ms(self, t: float) -> int:
        """A time of our monotonic clock on Redis' clock, in milliseconds."""
        return int((t + self.clock_offset_s) * 1e3)

    def now_ms(self) -> int:
        return self.to_ms(self.clock())

    def to_ns(self, t: float) -> int:
        """``to_ms`` in nanoseconds (span times)."""
        return int((t + self.clock_offset_s) * 1e9)

    def now_ns(self) -> int:
        return self.to_ns(self.clock())

    # ------------------------------------------------------------------------------ claims

    @property
    def shard_keys(self) -> list[QueueKeys]:
        """The keys of every shard claims are taken from (shard 0 alone by default)."""
        return self.keys.shards(self.settings.claim_shards)

    async def refresh_settings(self, *, force: bool = False) -> bool:
        """Read the queue's settings again when they are older than SETTINGS_REFRESH_S; True
        when the shard count to claim from changed."""
        now = self.clock()
        if (not force and self._settings_read_at is not None
                and now - self._settings_read_at < SETTINGS_REFRESH_S):
            return False
        self._settings_read_at = now
        before = self.settings.claim_shards
        self.settings = settings_from_hash(await self.redis.hgetall(self.keys.config))
        self.metrics.tenants = self.settings.tenants
        if self.settings.claim_shards != before:
            log.info("queue %s: claiming from %d shards", self.keys.queue,
                     self.settings.claim_shards)
            return True
        return False

    async def claim(self, max_count: int, *, min_priority: int | None = None
                    ) -> ops.ClaimReply:
        """Claim up to ``max_count`` requests (with ``min_priority``, only requests of at least
        that priority); their leases go into the book. A queue of one shard: one CLAIM call. A
        sharded queue: a PEEK at every shard's head first, then CLAIMs of the best priority
        band present only, from the shards that have it, so a lower priority is never taken
        while a higher one waits in another shard; each round starts with the next shard, so
        the shards of a band are drained at the same pace."""
        await self.refresh_settings()
        shards = self.settings.claim_shards
        floor = None if min_priority is None else band_top(min_priority)
        if shards == 1:
            reply = await self._claim_shard(0, max_count, floor)
        else:
            reply = await self._claim_sharded(shards, max_count, floor)
        self.clock_offset_s = reply.now_ms / 1e3 - self.clock()
        return reply

    async def head_priority(self) -> int | None:
        """The highest priority pending (None when nothing is) in the shards read: every
        shard of a queue of up to PEEK_SHARDS shards, else the next group of PEEK_SHARDS on
        each call (one read of each head, in one round trip), so a better request in any of
        S shards is seen within ceil(S / PEEK_SHARDS) calls."""
        pipe = self.redis.pipeline(transaction=False)
        for keys in self._next_head_group():
            pipe.zrange(keys.pending, 0, 0, withscores=True)
        heads = [rows[0][1] for rows in await pipe.execute() if rows]
        return scores.decode(min(heads))[0] if heads else None

    def _next_head_group(self) -> list[QueueKeys]:
        """The shards the next head read looks at: all of them up to PEEK_SHARDS, else the
        next group of PEEK_SHARDS (rotating like the claim rounds' PEEKs)."""
        shards = self.shard_keys
        first = self._first_peeked(len(shards), self._head_turn)
        self._head_turn += 1
        return [shards[(first + k) % len(shards)] for k in range(min(PEEK_SHARDS, len(shards)))]

    async def _claim_shard(self, shard: int, max_count: int,
                           max_score: int | None) -> ops.ClaimReply:
        mode, max_wait = self.affinity() if self.affinity is not None else ("", 0)
        keys, args = ops.claim_call(self.keys.for_shard(shard), self.config.worker_id,
                                    self.config.lease_ms, max_count, self.config.result_ttl_ms,
                                    max_score, affinity=mode, affinity_max_wait_ms=max_wait)
        reply = ops.parse_claim(await self.scripts["claim"](keys=keys, args=args))
        self.metrics.count_claims(len(reply.claimed), reply.preferred)
        if reply.expired:  # answered expired by the script, past their deadline
            self.metrics.count_expired(reply.expired)
        self.note_damage(reply.corrupt, reply.garbage)
        self.book.add_many([(c.id, c.token) for c in reply.claimed], shard)
        return reply

    async def _claim_sharded(self, shards: int, max_count: int,
                             floor: int | None) -> ops.ClaimReply:
        peeks: dict[int, ops.Peek] = {}
        candidates: list[int] = []
        top: int | None = None
        start = self._first_peeked(shards)
        for offset in range(0, shards, PEEK_SHARDS):
            group = [(start + offset + i) % shards
                     for i in range(min(PEEK_SHARDS, shards - offset))]
            # One round trip (per node on a cluster); a node that lost the script gets it again.
            calls = [(self.scripts["peek"], *ops.peek_call(self.keys.for_shard(k)))
                     for k in group]
            replies = await cluster.run_scripts_async(self.redis, calls)
            peeks.update((k, ops.parse_peek(x)) for k, x in zip(group, replies, strict=True))
            top, candidates = self._best(peeks, floor)
            if candidates:
                break
        self._shard_turn += 1
        now_ms = self.now_ms()
        claimed: list[ops.Claimed] = []
        expired = 0
        corrupt: list[tuple[str, str]] = []
        garbage: list[str] = []
        retries = [p.next_retry_ms for p in peeks.values() if p.next_retry_ms]
        for k in candidates:
            if len(claimed) >= max_count:
                break
            reply = await self._claim_shard(k, max_count - len(claimed), top)
            now_ms = reply.now_ms
            claimed += reply.claimed
            expired += reply.expired
            corrupt += reply.corrupt
            garbage += reply.garbage
            if reply.next_retry_ms is not None:
                retries.append(reply.next_retry_ms)
        return ops.ClaimReply(now_ms=now_ms, claimed=claimed, expired=expired,
                              next_retry_ms=min(retries, default=None), corrupt=corrupt,
                              garbage=garbage)

    def _first_peeked(self, shards: int, turn: int | None = None) -> int:
        """The shard this round peeks first: the next one each round with up to PEEK_SHARDS
        shards; beyond, the next group of PEEK_SHARDS, shifted by one after every cycle, so
        each shard comes first in turn. (``turn``: the round; the claim rounds' own.)"""
        turn = self._shard_turn if turn is None else turn
        if shards <= PEEK_SHARDS:
            return turn % shards
        cycle = -(-shards // PEEK_SHARDS)
        return ((turn % cycle) * PEEK_SHARDS + turn // cycle) % shards

    @staticmethod
    def _best(peeks: Mapping[int, ops.Peek], floor: int | None) -> tuple[int | None, list[int]]:
        """The top score to claim (the best band among ``peeks``, not below ``floor``) and the
        shards to claim it from, in peeking order (those with a retry due included)."""
        heads = [p.head for p in peeks.values() if p.head is not None]
        best = min((h // scores.SEQ_LIMIT for h in heads), default=None)
        top = None if best is None else (best + 1) * scores.SEQ_LIMIT - 1
        if floor is not None:
            # Nothing below the priority asked for (due retries are still promoted by the
            # claims below, and taken only if they reach it).
            top = floor if top is None else min(top, floor)
        return top, [k for k, p in peeks.items()
                     if (p.head is not None and p.head <= (top or 0)) or p.next_retry_ms == 0]

    def note_damage(self, corrupt: Sequence[tuple[str, str]], garbage: Sequence[str]) -> None:
        """Log and count what a script found damaged: requests it answered
        ``corrupt_request``, and raw keys it dropped as garbage."""
        q = self.keys.queue
        for request_id, why in corrupt:
            log.error("request %s answered corrupt_request: %s", request_id, why,
                      extra={"request_id": request_id})
        if corrupt:
            self.metrics.corrupt.labels(q).inc(len(corrupt))
            self.metrics.requests.labels(q, "failed").inc(len(corrupt))
        for key in garbage:
            log.error("dropped garbage key %s: nothing ties it to a request", key,
                      extra={"key": key})
        if garbage:
            self.metrics.garbage.labels(q).inc(len(garbage))

    async def start(self, leases: Sequence[tuple[str, str]]) -> set[str] | None:
        """START: mark these claims as running, right before the model runs them (from now
        on a lost lease costs each of them an attempt). Returns the ids whose lease was lost
        (they must not run; their leases leave the book), or None when Redis stayed down for
        as long as the leases last (the worker gave up; nothing was counted, the requests
        will be reclaimed unchanged). Retried through Redis errors like a completion."""
        lost: list[str] = []
        ids = [request_id for request_id, _ in leases]
        shards = self._per_shard(self.scripts["start"], ids, lambda keys, group: ops.start_call(
            keys, [leases[i] for i in group]), retried="start")
        async with contextlib.aclosing(shards):
            async for _, reply in shards:
                if reply is None:
                    return None
                lost += ops.parse_ids(reply)
        if lost:
            log.warning("%d claims lost their lease before they could start", len(lost))
            self.book.mark_lost(lost)
        if self.traces is not None:
            self.traces.ended(lost, "lease lost")
            self.traces.started(request_id for request_id in ids if request_id not in lost)
        return set(lost)

    async def until_leases_expire(self, write: Callable[[], Awaitable[T]], *, what: str,
                                  request_ids: Sequence[str] = ()) -> T | None:
        """``write()``, retried with backoff through Redis errors until the leases it concerns
        can no longer be valid; then None, and the leases of ``request_ids`` are forgotten
        (the queue reclaims those requests and runs them again). ``what`` names the write in
        the logs (a fixed label: "complete", "publish")."""
        give_up = self.clock() + self.config.lease_ms / 1e3
        backoff = RedisBackoff(what)
        while True:
            try:
                reply = await write()
            except RedisError as exc:
                if self.clock() > give_up:
                    log.error("%s: gave up after Redis errors for as long as a lease lasts "
                              "(%s); the requests concerned (%d finished) will be reclaimed "
                              "and run again", what, exc, len(request_ids))
                    self.book.drop_many(request_ids)
                    return None
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            return reply

    async def complete(self, completions: Sequence[ops.Completion], *,
                       scripts: Mapping[str, Any] | None = None) -> list[bool] | None:
        """One COMPLETE call for ``completions`` (one per shard of a sharded queue; see
        ``until_leases_expire``): which of them were written (a refused one had lost its
        lease or was cancelled), or None when the worker gave up. Their leases leave the book
        either way."""
        config = self.config
        written: list[bool] = [False] * len(completions)
        gave_up = False
        ids = [c.id for c in completions]
        self.book.completing(ids)
        async for positions, reply in self._per_shard(
                (scripts or self.scripts)["complete"], ids,
                lambda keys, group: ops.complete_call(keys, config.result_ttl_ms,
                                                      config.dead_letter_cap,
                                                      [completions[i] for i in group]),
                retried="complete"):
            if reply is None:
                gave_up = True
                continue
            for i, ok in zip(positions, ops.parse_complete(reply), strict=True):
                written[i] = ok
            self.book.drop_many([ids[i] for i in positions])
        if self.traces is not None:
            self.traces.completed(completions, None if gave_up else written)
        return None if gave_up else written

    async def publish(self, deltas: Sequence[ops.StreamDelta],
                      completions: Sequence[ops.Completion], *,
                      pipeline: ScriptPipeline | None = None) -> Published | None:
        """A generating worker's write, in one round trip: each running generation's new
        text (STREAM, token-checked) and the results of finished ones (COMPLETE, then
        STREAM_END), one call of each per shard of their leases; retried like a completion
        (``until_leases_expire``). None when the worker gave up; the leases of
        ``completions`` leave the book either way. ``pipeline``: the connection and scripts
        to use (default: the link's)."""
        config, book = self.config, self.book
        done_ids = [c.id for c in completions]
        delta_shards = book.shards_of([d.id for d in deltas])
        done_shards = book.shards_of(done_ids)
        calls: list[tuple[str, ops.Call]] = []
        stream_at: list[int] = []
        complete_at: list[tuple[int, list[int]]] = []  # (call index, positions in completions)
        for shard in sorted({0, *delta_shards, *done_shards}):
            keys = self.keys.for_shard(shard)
            stream_at.append(len(calls))
            calls.append(("stream", ops.stream_call(
                keys, config.result_ttl_ms,
                [d for d, k in zip(deltas, delta_shards, strict=True) if k == shard])))
            mine = [i for i, k in enumerate(done_shards) if k == shard]
            if mine:
                complete_at.append((len(calls), mine))
                calls.append(("complete", ops.complete_call(
                    keys, config.result_ttl_ms, config.dead_letter_cap,
                    [completions[i] for i in mine])))
                calls.append(("stream_end", ops.stream_end_call(
                    keys, config.result_ttl_ms, [done_ids[i] for i in mine])))
        book.completing(done_ids)
        client, scripts = ((pipeline.client, pipeline.scripts) if pipeline is not None
                           else (self.redis, self.scripts))
        replies = await self.until_leases_expire(
            lambda: run_script_calls(client, scripts, calls), what="publish",
            request_ids=done_ids)
        if replies is None:
            if self.traces is not None:
                self.traces.completed(completions, None)
            return None
        written = [False] * len(completions)
        for at, mine in complete_at:
            for i, ok in zip(mine, ops.parse_complete(replies[at]), strict=True):
                written[i] = ok
        book.drop_many(done_ids)
        if self.traces is not None:
            self.traces.completed(completions, written)
        return Published(lost={i for at in stream_at for i in ops.parse_ids(replies[at])},
                         written=written)

    async def release(self, leases: Sequence[tuple[str, str]], why: str = "") -> int:
        """Give claimed, unstarted requests back to pending; how many went back. On a Redis
        error their leases simply expire and they are reclaimed."""
        if not leases:
            return 0
        released = 0
        try:
            async for _, reply in self._per_shard(
                    self.scripts["release"], [r for r, _ in leases],
                    lambda keys, group: ops.release_call(keys, [leases[i] for i in group])):
                released += int(reply)
        except RedisError as exc:
            log.warning("could not give %d claims back (%s); their leases will expire and "
                        "they will be reclaimed", len(leases), exc)
            return released
        finally:
            for request_id, _ in leases:
                self.book.drop(request_id)
            if self.traces is not None:
                self.traces.ended([r for r, _ in leases], "released",
                                  {"inferq.why": why} if why else None)
        log.log(logging.DEBUG if why else logging.INFO,
                "gave %d unstarted requests back to the queue%s", released,
                f" ({why})" if why else "")
        return released

    async def _per_shard(self, script: Any, request_ids: Sequence[str],
                         make: Callable[[QueueKeys, list[int]], ops.Call], *,
                         retried: str | None = None) -> AsyncGenerator[tuple[list[int], Any]]:
        """For each shard holding leases of ``request_ids`` (shard 0 alone for most queues):
        the positions of its ids, and the reply of one ``script`` call for them (``make``
        builds its keys and args from the shard's keys and those positions). ``retried``: the
        call is retried like a write (``until_leases_expire``, named so in the logs); its
        reply is None when that gave up."""
        shards = self.book.shards_of(request_ids)
        groups: dict[int, list[int]] = {0: list(range(len(request_ids)))}
        if any(shards):
            groups = {}
            for i, shard in enumerate(shards):
                groups.setdefault(shard, []).append(i)
        for shard, positions in groups.items():
            keys, args = make(self.keys.for_shard(shard), positions)
            call = functools.partial(script, keys=keys, args=args)
            if retried is None:
                yield positions, await call()
            else:
                yield positions, await self.until_leases_expire(
                    call, what=retried, request_ids=[request_ids[i] for i in positions])

    def follow_shards(self, waiter: WakeWaiter, *first: str) -> None:
        """Make ``waiter`` (an idle worker's wake-up BLPOP) block on the wake list of every
        shard claims are taken from, after the lists in ``first`` (served before them: a
        generate worker's cancel list). Call it after each claim: a sharded queue's shards
        are read again about every second (``refresh_settings``)."""
        lists = [*first, *(keys.wake for keys in self.shard_keys)]
        if lists != waiter.keys:
            waiter.set_keys(lists)

    async def pending_above(self, priority: int) -> int:
        """Pending requests of strictly higher priority than ``priority`` (they score below
        its band), in the shards read: one ZCOUNT per shard of the group ``head_priority``
        reads next (every shard of a queue of up to PEEK_SHARDS shards)."""
        pipe = self.redis.pipeline(transaction=False)
        for keys in self._next_head_group():
            pipe.zcount(keys.pending, "-inf", f"({scores.band(priority)}")
        return sum(int(n) for n in await pipe.execute())

    # ---------------------------------------------------------------------------- upkeep

    async def register_queue(self) -> None:
        """List the queue in the namespace's registry (read by ``inferq stats``)."""
        await self.redis.sadd(queues_registry(self.config.namespace), self.keys.queue)

    async def read_tuning(self, model_id: str) -> dict[str, Any] | None:
        """The window tuning persisted for this queue and model, if any (and readable)."""
        key = self.keys.tuning(model_id)
        raw = await self.redis.hget(key, "state")
        if raw is None:
            return None
        try:
            state: dict[str, Any] = json.loads(raw)
        except ValueError:
            log.warning("ignoring unreadable tuning state at %s", key)
            return None
        return state

    async def reclaim(self) -> tuple[int, int]:
        """The leases of dead workers (their connections closed: ``liveness``) and expired
        leases of any worker back to pending (or dead), on every shard; (requeued, dead). A
        shard whose RECLAIM says a listing of the connections is due (one per
        ``liveness_probe_ms`` for the whole fleet) is swept again with the listing."""
        probe_ms = self.config.liveness_probe_ms if self.liveness.enabled else 0
        total = ops.ReclaimReply(0, 0)
        due: list[QueueKeys] = []
        for keys in self.shard_keys:
            reply = await self._reclaim_shard(keys, None, probe_ms)
            total = _add(total, reply)
            if reply.probe_due:
                due.append(keys)
        if due:
            connected = await self.liveness.connected_workers(self.redis)
            for keys in due if connected is not None else ():
                total = _add(total, await self._reclaim_shard(keys, connected, 0))
        self.metrics.reclaims.labels(self.keys.queue).inc(total.requeued)
        self.metrics.dead_letters.labels(self.keys.queue).inc(total.dead)
        if total.dead_workers:
            log.warning("workers %s are gone (their connections closed): their leases are "
                        "taken back now", ", ".join(sorted(set(total.dead_workers))))
        if total.requeued or total.dead:
            log.warning("reclaimed %d leases: %d never started (unchanged), %d runs lost with "
                        "their worker (not attempts; they rerun in half the batch), %d "
                        "dead-lettered crashed_worker", total.requeued + total.dead,
                        total.unstarted, total.lost, total.dead)
        if total.paced:
            log.warning("%d requests lost with their worker again (suspects of a crash): "
                        "they rerun in %d ms (--suspect-delay-ms)", total.paced,
                        total.paced_in_ms or 0)
        return total.requeued, total.dead

    async def _reclaim_shard(self, keys: QueueKeys, connected: Sequence[str] | None,
                             probe_ms: int) -> ops.ReclaimReply:
        config = self.config
        call_keys, args = ops.reclaim_call(
            keys, RECLAIM_BATCH, config.result_ttl_ms, config.dead_letter_cap,
            max_crashes=config.max_crashes, grace_ms=config.liveness_grace_ms,
            connected=connected, probe_ms=probe_ms, suspect_delay_ms=config.suspect_pace_ms)
        reply = ops.parse_reclaim(await self.scripts["reclaim"](keys=call_keys, args=args))
        self.note_damage(reply.corrupt, reply.garbage)
        return reply

    async def publish_stats(self, fields: Mapping[str, str], *,
                            tuning: tuple[str, Mapping[str, Any]] | None = None) -> None:
        """This worker's stats hash, read by ``inferq stats``; with ``tuning`` (model id,
        state), the window state persisted for that model too, in the same round trip."""
        key = self.keys.window(self.config.worker_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=cast("Mapping[Any, Any]", fields))
        pipe.pexpire(key, WINDOW_STATS_TTL_MS)
        if tuning is not None:
            pipe.hset(self.keys.tuning(tuning[0]), "state", json.dumps(tuning[1]))
            pipe.expire(self.keys.tuning(tuning[0]), TUNING_TTL_S)
        await pipe.execute()

    async def maintain(self, health: HealthState, device: str, *,
                       upkeep: Callable[[tuple[int, int]], Awaitable[None]],
                       detail: Callable[[], Mapping[str, Any]], stop: asyncio.Event) -> None:
        """Until ``stop`` is set: every ``reclaim_s`` (lease / 8) reclaim expired leases; after
        a reclaim that moved something, and at least every second, ``upkeep(reclaimed)`` (the
        worker's stats), sample the queue gauges, and mark the worker healthy with
        ``detail()``, or degraded while Redis fails."""
        interval = self.config.reclaim_s
        backoff = RedisBackoff("maintenance")
        next_upkeep = 0.0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                return
            try:
                reclaimed = await self.reclaim()
                if any(reclaimed) or self.clock() >= next_upkeep:
                    next_upkeep = self.clock() + 1.0
                    await upkeep(reclaimed)
                    await self.metrics.sample_queue(self.redis, self.keys, device)
                backoff.succeeded()
                health.ok(worker=self.config.worker_id, queue=self.keys.queue,
                          leases=len(self.book), **detail())
            except RedisError as exc:
                backoff.note(exc)
                health.failing(f"redis: {type(exc).__name__}")

    async def check_server(self) -> None:
        """Warn when the server could drop accepted requests (eviction, no persistence)."""
        try:
            policy = await self.redis.config_get("maxmemory-policy")
            aof = await self.redis.config_get("appendonly")
            save = await self.redis.config_get("save")
        except ResponseError:
            return  # CONFIG disabled (managed service, ACL): nothing to check
        if policy.get("maxmemory-policy", "noeviction") != "noeviction":
            log.warning("maxmemory-policy is %s: Redis may evict queued requests; "
                        "use noeviction", policy.get("maxmemory-policy"))
        if aof.get("appendonly") != "yes" and not save.get("save"):
            log.warning("Redis persistence is off (no AOF, no RDB): a server restart "
                        "loses every queued request")


def _add(a: ops.ReclaimReply, b: ops.ReclaimReply) -> ops.ReclaimReply:
    """Two reclaims' counts together (their damage is noted apart)."""
    return ops.ReclaimReply(a.requeued + b.requeued, a.dead + b.dead, [], [],
                            a.unstarted + b.unstarted, a.dead_workers + b.dead_workers,
                            a.lost + b.lost, paced=a.paced + b.paced,
                            paced_in_ms=max((ms for ms in (a.paced_in_ms, b.paced_in_ms)
                                             if ms is not None), default=None))


@dataclass(frozen=True, slots=True)
class Published:
    """What ``QueueLink.publish`` wrote."""

    #: Ids whose stream write was refused: their lease is gone (cancelled by the producer,
    #: finished elsewhere, reclaimed).
    lost: set[str]
    #: Per completion: written, or refused (its lease was lost).
    written: list[bool]


async def run_script_calls(client: Any, scripts: Mapping[str, Any],
                           calls: Sequence[tuple[str, ops.Call]]) -> list[Any]:
    """The queue's scripts ``calls`` (name, (keys, args)) in one round trip, in order
    (``cluster.script_round``): their replies."""
    return await plans.run_async(client, cluster.script_round(
        [(scripts[name], keys, args) for name, (keys, args) in calls]))


class ScriptPipeline:
    """Several of the queue's scripts in one round trip, in order, as plain EVALSHA on a
    connection of their own (``run_script_calls``)."""

    def __init__(self, client: Any, names: Sequence[str]) -> None:
        self.client = client
        self.names = tuple(names)
        self.scripts: Mapping[str, Any] = ops.register(client)

    async def load(self) -> None:
        """Load the scripts (a server that lost them later gets them again at the first
        call that meets NOSCRIPT)."""
        for name in self.names:
            script = self.scripts[name]
            script.sha = await self.client.script_load(script.script)

    async def __call__(self, calls: Sequence[tuple[str, ops.Call]]) -> list[Any]:
        """The replies, in order. A server that lost its script cache (restart, SCRIPT FLUSH)
        gets the refused scripts loaded again, and only the calls it refused run again, so
        nothing is written twice."""
        return await run_script_calls(self.client, self.scripts, calls)
