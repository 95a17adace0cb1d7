"""Every Redis call a worker makes on its queue, but the heartbeat's (``leases``) and the
wake-up BLPOP (``wake``): the scripts (several in one round trip: ``ScriptPipeline``), the
queue registry, the priority check of a pre-claimed window, the window tuning, the stats hash,
and the maintenance loop (reclaims, health).

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from redis.exceptions import NoScriptError, RedisError, ResponseError

from inferq import cluster
from inferq.protocol import ops, scores
from inferq.protocol.keys import QueueKeys, queues_registry
from inferq.protocol.settings import QueueSettings, settings_from_hash
from inferq.worker.core.backoff import RedisBackoff
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.leases import LeaseBook
from inferq.worker.core.metrics import HealthState, WorkerMetrics

log = logging.getLogger("inferq.worker")

#: Expired leases one RECLAIM call moves back to pending (or to the dead letters).
RECLAIM_BATCH = 500
#: Lifetime of a worker's stats hash (``inferq stats``): it vanishes soon after the worker.
WINDOW_STATS_TTL_MS = 15_000
#: Lifetime of the persisted window tuning of a (queue, model).
TUNING_TTL_S = 7 * 24 * 3600
#: How often the queue's settings (its shard count) are read again.
SETTINGS_REFRESH_S = 1.0

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
        self._settings_read_at: float | None = None

    def attach(self, redis: Any, scripts: Mapping[str, Any]) -> None:
        """The connection and registered scripts to use (made in the worker's event loop)."""
        self.redis = redis
        self.scripts = scripts

    def to_ms(self, t: float) -> int:
        """A time of our monotonic clock on Redis' clock, in milliseconds."""
        return int((t + self.clock_offset_s) * 1e3)

    def now_ms(self) -> int:
        return self.to_ms(self.clock())

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
        while a higher one waits in another shard."""
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
        """The highest priority pending in any shard (one read of each shard's head, in one
        round trip), or None when nothing is pending."""
        pipe = self.redis.pipeline(transaction=False)
        for keys in self.shard_keys:
            pipe.zrange(keys.pending, 0, 0, withscores=True)
        heads = [rows[0][1] for rows in await pipe.execute() if rows]
        return scores.decode(min(heads))[0] if heads else None

    async def _claim_shard(self, shard: int, max_count: int,
                           max_score: int | None) -> ops.ClaimReply:
        keys, args = ops.claim_call(self.keys.for_shard(shard), self.config.worker_id,
                                    self.config.lease_ms, max_count, self.config.result_ttl_ms,
                                    max_score)
        reply = ops.parse_claim(await self.scripts["claim"](keys=keys, args=args))
        if reply.expired:  # answered expired by the script, past their deadline
            self.metrics.count_expired(reply.expired)
        self.note_damage(reply.corrupt, reply.garbage)
        self.book.add_many([(c.id, c.token) for c in reply.claimed], shard)
        return reply

    async def _claim_sharded(self, shards: int, max_count: int,
                             floor: int | None) -> ops.ClaimReply:
        # One round trip (per node on a cluster); a node that lost the script gets it again.
        calls = [(self.scripts["peek"], *ops.peek_call(self.keys.for_shard(k)))
                 for k in range(shards)]
        peeks = [ops.parse_peek(x) for x in await cluster.run_scripts_async(self.redis, calls)]
        heads = [p.head for p in peeks if p.head is not None]
        best = min((h // scores.SEQ_LIMIT for h in heads), default=None)
        top = None if best is None else (best + 1) * scores.SEQ_LIMIT - 1
        if floor is not None:
            # Nothing below the priority asked for (due retries are still promoted by the
            # claims below, and taken only if they reach it).
            top = floor if top is None else min(top, floor)
        candidates = [k for k, p in enumerate(peeks)
                      if (p.head is not None and p.head <= (top or 0))
                      or p.next_retry_ms == 0]
        now_ms = self.now_ms()
        claimed: list[ops.Claimed] = []
        expired = 0
        corrupt: list[tuple[str, str]] = []
        garbage: list[str] = []
        retries = [p.next_retry_ms for p in peeks if p.next_retry_ms]
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

    def _by_shard(self, request_ids: Sequence[str]) -> dict[int, list[int]]:
        """Positions of ``request_ids`` grouped by the shard of their lease."""
        shards = self.book.shards_of(request_ids)
        if not any(shards):
            return {0: list(range(len(request_ids)))}
        groups: dict[int, list[int]] = {}
        for i, shard in enumerate(shards):
            groups.setdefault(shard, []).append(i)
        return groups

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
        start = self.scripts["start"]
        for shard, positions in self._by_shard([request_id for request_id, _ in leases]).items():
            group = [leases[i] for i in positions]
            keys, args = ops.start_call(self.keys.for_shard(shard), group)
            reply = await self.until_leases_expire(
                functools.partial(start, keys=keys, args=args), what="start",
                request_ids=[request_id for request_id, _ in group])
            if reply is None:
                return None
            lost += ops.parse_ids(reply)
        if lost:
            log.warning("%d claims lost their lease before they could start", len(lost))
            self.book.mark_lost(lost)
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
        complete = (scripts or self.scripts)["complete"]
        written: list[bool] = [False] * len(completions)
        gave_up = False
        ids = [c.id for c in completions]
        self.book.completing(ids)
        for shard, positions in self._by_shard(ids).items():
            group = [completions[i] for i in positions]
            group_ids = [ids[i] for i in positions]
            keys, args = ops.complete_call(self.keys.for_shard(shard),
                                           self.config.result_ttl_ms,
                                           self.config.dead_letter_cap, group)
            reply = await self.until_leases_expire(
                functools.partial(complete, keys=keys, args=args), what="complete",
                request_ids=group_ids)
            if reply is None:
                gave_up = True
                continue
            for i, ok in zip(positions, ops.parse_complete(reply), strict=True):
                written[i] = ok
            self.book.drop_many(group_ids)
        return None if gave_up else written

    async def release(self, leases: Sequence[tuple[str, str]], why: str = "") -> int:
        """Give claimed, unstarted requests back to pending; how many went back. On a Redis
        error their leases simply expire and they are reclaimed."""
        if not leases:
            return 0
        released = 0
        try:
            for shard, positions in self._by_shard([r for r, _ in leases]).items():
                keys, args = ops.release_call(self.keys.for_shard(shard),
                                              [leases[i] for i in positions])
                released += int(await self.scripts["release"](keys=keys, args=args))
        except RedisError as exc:
            log.warning("could not give %d claims back (%s); their leases will expire and "
                        "they will be reclaimed", len(leases), exc)
            return released
        finally:
            for request_id, _ in leases:
                self.book.drop(request_id)
        log.log(logging.DEBUG if why else logging.INFO,
                "gave %d unstarted requests back to the queue%s", released,
                f" ({why})" if why else "")
        return released

    async def pending_above(self, priority: int) -> int:
        """Pending requests of strictly higher priority than ``priority`` (one ZCOUNT per
        shard: they score below its band)."""
        pipe = self.redis.pipeline(transaction=False)
        for keys in self.shard_keys:
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
        """Expired leases of any worker back to pending (or dead), on every shard;
        (requeued, dead)."""
        requeued = dead = unstarted = 0
        for keys in self.shard_keys:
            call_keys, args = ops.reclaim_call(keys, RECLAIM_BATCH, self.config.result_ttl_ms,
                                               self.config.dead_letter_cap)
            reply = ops.parse_reclaim(await self.scripts["reclaim"](keys=call_keys, args=args))
            requeued += reply.requeued
            dead += reply.dead
            unstarted += reply.unstarted
            self.note_damage(reply.corrupt, reply.garbage)
        self.metrics.reclaims.labels(self.keys.queue).inc(requeued)
        self.metrics.dead_letters.labels(self.keys.queue).inc(dead)
        if requeued or dead:
            log.warning("reclaimed %d expired leases: %d never started (attempts unchanged), "
                        "%d dead-lettered", requeued + dead, unstarted, dead)
        return requeued, dead

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


class ScriptPipeline:
    """Several of the queue's scripts in one round trip, in order, as plain EVALSHA on a
    connection of their own (redis-py's pipelined script objects would first send SCRIPT
    EXISTS: a second round trip at every call)."""

    def __init__(self, client: Any, names: Sequence[str]) -> None:
        self.client = client
        self.names = tuple(names)
        self.scripts: Mapping[str, Any] = ops.register(client)

    async def load(self) -> None:
        """Plain EVALSHA needs the scripts loaded; done at start and after a server lost them."""
        for name in self.names:
            script = self.scripts[name]
            script.sha = await self.client.script_load(script.script)

    async def __call__(self, calls: Sequence[tuple[str, ops.Call]]) -> list[Any]:
        """The replies, in order. A server that lost its script cache (restart, SCRIPT FLUSH)
        gets all of them loaded again, and only the calls it refused run again, so nothing is
        written twice."""
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                name, (keys, args) = calls[i]
                # As a raw command: redis-py's cluster pipelines refuse ``evalsha``.
                pipe.execute_command("EVALSHA", self.scripts[name].sha, len(keys), *keys,
                                     *args)
            results = await pipe.execute(raise_on_error=False)
            missing = []
            for i, result in zip(todo, results, strict=True):
                if isinstance(result, NoScriptError) and attempt == 1:
                    missing.append(i)
                elif isinstance(result, Exception):
                    raise result
                else:
                    replies[i] = result
            if not missing:
                return replies
            await self.load()
            todo = missing
        raise AssertionError("unreachable")
