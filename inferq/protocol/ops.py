"""Arguments for, and replies of, the Lua scripts: shared by the sync SDK, the async SDK and the
worker so that each script has exactly one Python description.

The scripts (``lua/<name>.lua``, each with a KEYS/ARGV header that a test checks against
its ``<name>_call`` here), in a request's life:

* ``enqueue``: idempotent on the id, priority-aware back-pressure; one sequence block, one
  ``ZADD`` and one ``HSET`` per request.
* ``peek``: read-only head of one shard (and whether a retry is due), so a worker of a sharded
  queue claims only the best priority present across shards.
* ``claim``: promotes due retries, then moves up to N checked requests (at most a given score)
  to ``inflight`` with a fresh lease token; answers expired and damaged ones; counts no attempt.
* ``start``: right before the model runs them, marks claims as running (token-checked): from
  then on a lost lease costs an attempt.
* ``heartbeat``: extends the leases whose token matches; marks the worker alive.
* ``complete``: token-checked, first writer wins; results, retries, dead letters; deletes the
  request hash; stats and reply inboxes once per call.
* ``reclaim``: the leases of dead workers (closed connections) and expired leases back to
  pending (a started run counts as lost, not as an attempt; bisection cap) or dead
  (``crashed_worker``).
* ``release``: claims that did not run back to pending at once (undoes a ``start``).
* ``cancel``, ``stream``, ``stream_end``: cancellation and a generation's text stream.
* ``requeue``, ``purge``: an operator's actions on dead letters (``inferq.deadletters``).

Every script checks the fields it acts on before its first write (see ``scripts``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from inferq.protocol import scripts
from inferq.protocol.keys import QueueKeys

Call = tuple[list[str], list[bytes | str | int]]

# Raw strings only (no bin type): the cmsgpack of Redis 7.0 cannot read msgpack bin.
_packer = msgpack.Packer(use_bin_type=False)


def packed(values: list[Any]) -> bytes:
    """The per-request values of a worker's call as ONE script argument (a msgpack array the
    script unpacks with ``cmsgpack``): one C call here, where thousands of separate arguments
    cost redis-py's pure-Python command packer ~10 us of worker CPU per request."""
    data: bytes = _packer.pack(values)
    return data


def register(client: Any) -> dict[str, Any]:
    """Register every script once on a (sync or asyncio) redis client; EVALSHA from then on."""
    return {name: client.register_script(source) for name, source in scripts.ALL.items()}


def as_str(value: Any) -> str:
    """A Redis reply as text, from a client with or without ``decode_responses``."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class EnqueueItem:
    id: str
    band: int
    payload: bytes
    deadline_ms: int | None
    max_attempts: int
    reply_to: str | None = None
    #: Refuse (shed) when the pending depth is already at this limit; 0 = unbounded.
    depth_limit: int = 0
    #: Fair shares within the band (``inferq.protocol.fair``): the tenant ("" = none), its weight
    #: and the request's cost.
    tenant: str = ""
    weight: int = 1
    cost: int = 1
    #: Refuse the request (``tenant_full``) when its tenant already has this many unfinished
    #: requests on the shard; 0 = no limit.
    tenant_limit: int = 0
    #: The latency objective in ms (``inferq.protocol.slo``); 0 = none.
    slo_ms: int = 0
    #: The queue's order and admission (``slo.policy``), as routing read them: the same for
    #: every item of one call.
    policy: str = "fair"
    #: Cache affinity (``inferq.protocol.prefix``): the session's identity ("" = none) and
    #: the prompt's prefix hash chain, space-separated ("" = none: not a generate request).
    session: str = ""
    prefixes: str = ""


def enqueue_call(keys: QueueKeys, items: Sequence[EnqueueItem], *, atomic: bool = False,
                 policy: str | None = None) -> Call:
    """``atomic``: all or none (if the queue would shed any new item, it sheds them all).
    ``policy``: the queue's order and admission (``slo.policy``); default: the items'."""
    if policy is None:
        policy = items[0].policy if items else "fair"
    rows: list[Any] = []
    for item in items:
        rows += [item.id, item.band, item.payload,
                 "" if item.deadline_ms is None else item.deadline_ms, item.max_attempts,
                 item.reply_to or "", item.depth_limit, item.tenant, item.weight, item.cost,
                 item.tenant_limit, item.slo_ms, item.session, item.prefixes]
    args: list[bytes | str | int] = [keys.prefix, packed(rows), policy]
    if atomic:
        args.append("atomic")
    return [keys.pending, keys.seq, keys.wake, keys.stats, keys.fair, keys.inflight], args


@dataclass(frozen=True, slots=True)
class EnqueueReply:
    depth: int
    #: Per item: queued, or pending/inflight/delayed/done for a repeated id, or full (shed),
    #: or tenant_full (the tenant's limit).
    outcomes: list[str]
    retry_after_ms: int
    #: Under admission by prediction: the predicted ms to the result (first token) of each
    #: queued item with an objective, by its index in the call.
    predicted_ms: dict[int, int] = field(default_factory=dict)


def parse_enqueue(reply: Any) -> EnqueueReply:
    flat = [int(x) for x in reply[3]] if len(reply) > 3 else []
    return EnqueueReply(int(reply[0]), [as_str(x) for x in reply[1]], int(reply[2]),
                        {row - 1: ms for row, ms in zip(flat[::2], flat[1::2], strict=True)})


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    payload: bytes
    token: str
    #: The number this run will have once it starts: 1 + the runs that failed before and
    #: were retried (a run lost with its worker is not an attempt: see ``lost``).
    attempt: int
    enqueued_ms: int
    deadline_ms: int | None
    #: The reply inbox and tenant of the request ('' for none): carried back by its
    #: completion, so COMPLETE reads nothing per request.
    reply_to: str = ""
    tenant: str = ""
    #: The largest batch it may run in (0: no limit): half the batch it was lost in when its
    #: worker died (bisection); 1: a suspect, which runs alone (``results.is_suspect``).
    cap: int = 0
    #: Runs of it lost with their worker so far (not attempts).
    lost: int = 0
    #: The ms to its result (first token) admission predicted at enqueue; 0: none.
    predicted_ms: int = 0


@dataclass(frozen=True, slots=True)
class ClaimReply:
    now_ms: int
    claimed: list[Claimed]
    expired: int
    #: Milliseconds until the next delayed retry is due, or None when none waits.
    next_retry_ms: int | None
    #: Damaged requests the script answered ``corrupt_request``: (id, what was wrong).
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    #: Raw keys the script dropped as garbage (nothing tied them to a request).
    garbage: list[str] = field(default_factory=list)
    #: Of ``claimed``, those taken by cache-affinity preference (the worker held their
    #: prefix or session).
    preferred: int = 0


def claim_call(keys: QueueKeys, owner: str, lease_ms: int, max_count: int,
               result_ttl_ms: int, max_score: int | None = None, *, affinity: str = "",
               affinity_max_wait_ms: int = 0) -> Call:
    """``max_score``: take only pending requests scored at most this (one priority band of a
    sharded queue, see ``scores.band``); None takes the head whatever its priority.
    ``affinity``: '' (the head, in order), or ``prefix`` / ``session``: prefer, inside the
    head's band, the requests whose prefix or session the worker holds
    (``lua/includes/affinity.lua``), none passed over longer than ``affinity_max_wait_ms``."""
    return ([keys.pending, keys.inflight, keys.stats, keys.delayed, keys.wake, keys.leases,
             keys.workers],
            [keys.prefix, owner, lease_ms, max_count, result_ttl_ms,
             "" if max_score is None else max_score, affinity, affinity_max_wait_ms])


def _pairs(flat: Any) -> list[tuple[str, str]]:
    items = [as_str(x) for x in flat]
    return list(zip(items[::2], items[1::2], strict=True))


def parse_claim(reply: Any) -> ClaimReply:
    rows = reply[1]
    if rows and isinstance(rows[0][0], bytes):  # a client without decode_responses: one pass
        claimed = [Claimed(i.decode("utf-8", "replace"), p, t.decode("utf-8", "replace"),
                           int(a), int(e), int(d) if d else None,
                           rt.decode("utf-8", "replace"), tn.decode("utf-8", "replace"),
                           int(n), int(lost), int(pw))
                   for i, p, t, a, e, d, rt, tn, n, lost, pw in rows]
    else:
        claimed = [Claimed(as_str(i), bytes(p), as_str(t), int(a), int(e),
                           int(d) if d not in (b"", "", None) else None, as_str(rt), as_str(tn),
                           int(n), int(lost), int(pw))
                   for i, p, t, a, e, d, rt, tn, n, lost, pw in rows]
    next_due = int(reply[3])
    return ClaimReply(now_ms=int(reply[0]), claimed=claimed, expired=int(reply[2]),
                      next_retry_ms=None if next_due < 0 else next_due,
                      corrupt=_pairs(reply[4]), garbage=[as_str(k) for k in reply[5]],
                      preferred=int(reply[6]) if len(reply) > 6 else 0)


def hold_call(keys: QueueKeys, owner: str, ttl_ms: int, identities: Sequence[str]) -> Call:
    """Replace ``owner``'s held set (``QueueKeys.held``) with ``identities``, expiring after
    ``ttl_ms``; ``ttl_ms`` 0 deletes it."""
    return [keys.stats], [keys.prefix, owner, ttl_ms, *identities]


def peek_call(keys: QueueKeys) -> Call:
    return [keys.pending, keys.delayed], []


@dataclass(frozen=True, slots=True)
class Peek:
    #: The lowest pending score (best priority, oldest), or None when pending is empty.
    head: int | None
    #: Milliseconds until the shard's next delayed retry is due (0: due now), or None.
    next_retry_ms: int | None


def parse_peek(reply: Any) -> Peek:
    head = as_str(reply[0])
    due = int(reply[1])
    return Peek(int(float(head)) if head else None, None if due < 0 else due)


def _flat(leases: Iterable[tuple[str, str]]) -> list[str]:
    return [value for lease in leases for value in lease]


def start_call(keys: QueueKeys, leases: Iterable[tuple[str, str]]) -> Call:
    return [keys.started, keys.leases], [keys.prefix, packed(_flat(leases))]


def heartbeat_call(keys: QueueKeys, worker_id: str, lease_ms: int, liveness_ms: int,
                   leases: Iterable[tuple[str, str]]) -> Call:
    return ([keys.inflight, keys.workers, keys.leases, keys.conns],
            [keys.prefix, worker_id, lease_ms, liveness_ms, packed(_flat(leases))])


def parse_ids(reply: Any) -> list[str]:
    return [as_str(x) for x in reply]


@dataclass(frozen=True, slots=True)
class Completion:
    """The outcome of one claim, with what its claim carried (``Claimed``): the script
    checks the token, and trusts the rest because the token matched."""

    claimed: Claimed
    #: A final result status (ok, failed, expired, dead, ...) or ``retry``.
    status: str
    body: bytes
    retry_delay_ms: int = 0
    #: Billable tokens of a final result (embeddings: the input tokens as prompt tokens),
    #: counted in the shard's usage hash by the script that writes it (``keys.USAGE``).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Whether a final result met the request's latency objective (``Result.slo_met``); None
    #: without one. Counted by the worker (goodput), not sent to the script.
    slo_met: bool | None = None
    #: The actual time to its result (first token) over the one admission predicted
    #: (``Claimed.predicted_ms``); None without a prediction. Counted by the worker.
    predicted_ratio: float | None = None

    @property
    def id(self) -> str:
        return self.claimed.id

    @property
    def token(self) -> str:
        return self.claimed.token


def complete_call(keys: QueueKeys, result_ttl_ms: int, dead_cap: int,
                  items: Sequence[Completion]) -> Call:
    values: list[Any] = []
    for item in items:
        c = item.claimed
        values += (c.id, c.token, item.status, item.body, item.retry_delay_ms, c.attempt,
                   c.enqueued_ms, c.reply_to, c.tenant, max(0, int(item.prompt_tokens)),
                   max(0, int(item.completion_tokens)))
    return ([keys.inflight, keys.stats, keys.delayed, keys.dead, keys.wake, keys.started,
             keys.dead_letters, keys.leases, keys.fair],
            [keys.prefix, result_ttl_ms, dead_cap, packed(values)])


def parse_complete(reply: Any) -> list[bool]:
    return [int(x) == 1 for x in reply]


#: Runs lost alone (crashes) after which a request is dead-lettered ``crashed_worker``.
DEFAULT_MAX_CRASHES = 2


def reclaim_call(keys: QueueKeys, max_count: int, result_ttl_ms: int, dead_cap: int, *,
                 max_crashes: int = DEFAULT_MAX_CRASHES, grace_ms: int = 0,
                 connected: Sequence[str] | None = None, probe_ms: int = 0,
                 suspect_delay_ms: int = 0) -> Call:
    """``connected``: the ids of the workers with a connection now (``CLIENT LIST``), whose
    registered peers without one for ``grace_ms`` are dead; None: leases only, and with
    ``probe_ms`` the reply says whether a listing is due (none in ``probe_ms``).
    ``suspect_delay_ms``: a request whose run is lost with its worker again (it was lost
    before) reruns at the queue's next suspect slot, at least this long after now and after
    the previous slot (0: at once)."""
    return ([keys.inflight, keys.pending, keys.dead, keys.wake, keys.stats, keys.started,
             keys.dead_letters, keys.leases, keys.workers, keys.conns, keys.delayed],
            [keys.prefix, max_count, result_ttl_ms, dead_cap, max_crashes, grace_ms,
             "" if connected is None else packed(list(connected)), probe_ms,
             suspect_delay_ms])


@dataclass(frozen=True, slots=True)
class ReclaimReply:
    #: Back to pending (of which ``unstarted`` never ran: unchanged).
    requeued: int
    #: Dead-lettered ``crashed_worker``: lost while running alone ``max_crashes`` times.
    dead: int
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    garbage: list[str] = field(default_factory=list)
    unstarted: int = 0
    #: Workers found dead by their closed connections (their leases were all reclaimed).
    dead_workers: list[str] = field(default_factory=list)
    #: Runs lost with their worker (requeued with a halved batch cap, or dead-lettered).
    lost: int = 0
    #: The caller should list the connected workers and call again with them.
    probe_due: bool = False
    #: Of ``requeued``: lost again, so put in delayed until the queue's next suspect slot,
    #: which comes ``paced_in_ms`` from now (None: none paced).
    paced: int = 0
    paced_in_ms: int | None = None

    @property
    def counts(self) -> tuple[int, int]:
        """(requeued, dead)."""
        return self.requeued, self.dead


def parse_reclaim(reply: Any) -> ReclaimReply:
    paced_in = int(reply[9])
    return ReclaimReply(int(reply[0]), int(reply[1]), _pairs(reply[2]),
                        [as_str(k) for k in reply[3]], int(reply[4]),
                        [as_str(w) for w in reply[5]], int(reply[6]), int(reply[7]) == 1,
                        int(reply[8]), None if paced_in < 0 else paced_in)


def release_call(keys: QueueKeys, leases: Iterable[tuple[str, str]]) -> Call:
    return ([keys.inflight, keys.pending, keys.wake, keys.started, keys.leases, keys.stats],
            [keys.prefix, packed(_flat(leases))])


def cancel_call(keys: QueueKeys, request_id: str, result_ttl_ms: int) -> Call:
    return ([keys.pending, keys.inflight, keys.stats, keys.delayed, keys.started, keys.leases],
            [keys.prefix, request_id, result_ttl_ms])


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One running generation's text and token ids since the last write (neither: the call
    checks the lease only)."""

    id: str
    token: str
    attempt: int
    text: str
    token_ids: Sequence[int] = ()


def stream_call(keys: QueueKeys, result_ttl_ms: int, items: Iterable[StreamDelta]) -> Call:
    args: list[bytes | str | int] = [keys.prefix, result_ttl_ms]
    for item in items:
        args += [item.id, item.token, item.attempt, item.text,
                 " ".join(map(str, item.token_ids))]
    return [keys.inflight, keys.leases], args


def stream_end_call(keys: QueueKeys, result_ttl_ms: int, request_ids: Iterable[str]) -> Call:
    return [keys.inflight], [keys.prefix, result_ttl_ms, *request_ids]


def requeue_call(keys: QueueKeys, request_ids: Iterable[str]) -> Call:
    return ([keys.dead, keys.dead_letters, keys.pending, keys.wake, keys.stats],
            [keys.prefix, *request_ids])


def purge_call(keys: QueueKeys, request_ids: Iterable[str]) -> Call:
    return [keys.dead, keys.dead_letters, keys.stats], [keys.prefix, *request_ids]
