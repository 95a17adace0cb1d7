"""The Lua scripts: every state change of a request is exactly one of these atomic calls.

Each script reads the time from Redis ``TIME`` (one clock for every producer and worker) and
builds per-request keys from ``prefix`` (``inferq:{task:model}:``), so every key it touches
shares the queue's hash tag and lives in one cluster slot.

Request hash ``<prefix>req:<id>`` fields: ``p`` payload (msgpack), ``s`` pending score,
``st`` state (``pending``/``inflight``/``delayed`` awaiting a retry), ``a`` attempts so far,
``ma`` max attempts, ``eq`` enqueue time (ms), ``dl`` absolute deadline (ms, optional),
``rt`` reply inbox (optional), ``o`` owner, ``t`` lease token, ``cl`` claim time (ms).

Result ``<prefix>result:<id>`` is a list holding one msgpack result with a TTL; waiters block
on it with ``BLMOVE key key`` (a rotation that leaves it in place), so a waiting producer is
woken by the write itself: no polling, no pub/sub message to drop.
"""

from __future__ import annotations

# Helpers shared by several scripts (prepended to them). Numbers are formatted with %.0f:
# redis.call would otherwise render a Lua double with %.14g and lose digits of large scores.
_PRELUDE = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function num(x) return string.format('%.0f', x) end
-- Writes the result once (first writer wins) and, when the request named a reply inbox (an
-- async client waiting on many results over one connection), pushes "<id> <result>" there too
-- (ids never contain a space), so the client needs no read per result.
local INBOX_CAP = 100000
local function put_result(prefix, id, body, ttl)
  local k = prefix .. 'result:' .. id
  if redis.call('EXISTS', k) == 1 then return 0 end
  redis.call('RPUSH', k, body)
  redis.call('PEXPIRE', k, ttl)
  local rt = redis.call('HGET', prefix .. 'req:' .. id, 'rt')
  if rt then
    local inbox = prefix .. 'inbox:' .. rt
    redis.call('RPUSH', inbox, id .. ' ' .. body)
    redis.call('LTRIM', inbox, -INBOX_CAP, -1)
    redis.call('PEXPIRE', inbox, ttl)
  end
  return 1
end
local function count_done(stats, status, n, now)
  redis.call('HINCRBY', stats, status, n)
  local sec = math.floor(now / 1000)
  local slot = sec % 64
  if redis.call('HGET', stats, 'ts:' .. slot) ~= num(sec) then
    redis.call('HSET', stats, 'ts:' .. slot, num(sec), 'n:' .. slot, 0)
  end
  redis.call('HINCRBY', stats, 'n:' .. slot, n)
end
local function recent_rate(stats, now)
  -- completions per second over the last 10 full seconds, from count_done's ring of slots
  local sec = math.floor(now / 1000)
  local total = 0
  for slot = 0, 63 do
    local ts = tonumber(redis.call('HGET', stats, 'ts:' .. slot) or '0')
    if ts >= sec - 10 and ts < sec then
      total = total + tonumber(redis.call('HGET', stats, 'n:' .. slot) or '0')
    end
  end
  return total / 10
end
local function wake_workers(wake, n)
  n = math.min(n, 64 - redis.call('LLEN', wake))
  if n > 0 then
    local tokens = {}
    for i = 1, n do tokens[i] = '1' end
    redis.call('RPUSH', wake, unpack(tokens))
  end
end
local function error_result(id, status, code, message, h_attempts, h_eq, now)
  return cmsgpack.pack({v = 1, id = id, status = status,
    error = {code = code, message = message},
    attempts = tonumber(h_attempts or 0), enqueued_ms = tonumber(h_eq or now), finished_ms = now})
end
"""

ENQUEUE = _PRELUDE + r"""
-- KEYS: 1 pending, 2 seq, 3 wake, 4 stats
-- ARGV: 1 prefix, then per request 7 values: id, priority band, payload,
--       relative deadline ms or '', max attempts, reply inbox or '',
--       depth limit for this request's priority (0 = unbounded)
-- Returns {depth, {outcome per request}, retry_after_ms}; each outcome is
-- 'queued', 'pending', 'inflight', 'delayed', 'done' (a repeated id) or 'full' (shed:
-- the queue is at the depth limit of that priority). retry_after_ms estimates when the
-- excess drains at the recent completion rate.
local pending, seqkey, wake, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = ARGV[1]
local now = now_ms()
local depth = redis.call('ZCARD', pending)
local out, queued, worst_excess = {}, 0, 0
for i = 2, #ARGV, 7 do
  local id = ARGV[i]
  local rkey = prefix .. 'req:' .. id
  local limit = tonumber(ARGV[i + 6])
  local state = redis.call('HGET', rkey, 'st')
  if state then
    out[#out + 1] = state
  elseif redis.call('EXISTS', prefix .. 'result:' .. id) == 1 then
    out[#out + 1] = 'done'
  elseif limit > 0 and depth >= limit then
    out[#out + 1] = 'full'
    worst_excess = math.max(worst_excess, depth - limit + 1)
  else
    local score = num(tonumber(ARGV[i + 1]) + redis.call('INCR', seqkey))
    redis.call('ZADD', pending, score, id)
    redis.call('HSET', rkey, 'p', ARGV[i + 2], 's', score, 'st', 'pending', 'a', 0,
      'ma', ARGV[i + 4], 'eq', num(now))
    if ARGV[i + 3] ~= '' then
      redis.call('HSET', rkey, 'dl', num(now + tonumber(ARGV[i + 3])))
    end
    if ARGV[i + 5] ~= '' then redis.call('HSET', rkey, 'rt', ARGV[i + 5]) end
    depth = depth + 1
    queued = queued + 1
    out[#out + 1] = 'queued'
  end
end
if queued > 0 then wake_workers(wake, queued) end
local retry_after = 0
if worst_excess > 0 then
  local rate = recent_rate(stats, now)
  if rate > 0 then
    retry_after = math.min(math.ceil(worst_excess / rate * 1000), 60000)
  else
    retry_after = 1000
  end
end
return {depth, out, retry_after}
"""

CLAIM = _PRELUDE + r"""
-- KEYS: 1 pending, 2 inflight, 3 stats, 4 delayed, 5 wake
-- ARGV: 1 prefix, 2 owner, 3 lease ms, 4 max count, 5 result ttl ms
-- First promotes retries whose backoff has passed from delayed to pending (original score).
-- Then moves up to max count ids from pending to inflight (score = lease deadline), recording
-- owner, a fresh lease token (owner/attempt) and the attempt count. A request whose deadline
-- already passed is answered 'expired' here and never runs. When pending is left empty the
-- wake list is cleared, so stale tokens never accumulate.
-- Returns {now, {{id, payload, token, attempt, enqueued ms, deadline ms or ''}, ...}, expired,
-- ms until the next delayed retry is due or -1}.
local pending, inflight, stats, delayed, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, owner = ARGV[1], ARGV[2]
local lease, max_n, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', num(now), 'LIMIT', 0, 1000)
for _, id in ipairs(due) do
  redis.call('ZREM', delayed, id)
  local score = redis.call('HGET', prefix .. 'req:' .. id, 's')
  if score then
    redis.call('HSET', prefix .. 'req:' .. id, 'st', 'pending')
    redis.call('ZADD', pending, score, id)
  end
end
local popped = redis.call('ZPOPMIN', pending, max_n)
local out, expired, broken = {}, 0, 0
for i = 1, #popped, 2 do
  local id = popped[i]
  local rkey = prefix .. 'req:' .. id
  local h = redis.call('HMGET', rkey, 'p', 'a', 'eq', 'dl')
  if not h[1] and h[3] then
    -- a request hash without its payload (damaged by hand): answer it, never drop it silently
    put_result(prefix, id, error_result(id, 'failed', 'invalid_request',
      'the stored request has no payload', h[2], h[3], now), ttl)
    redis.call('DEL', rkey)
    broken = broken + 1
  elseif h[1] then
    local attempt = tonumber(h[2]) + 1
    if h[4] and tonumber(h[4]) <= now then
      put_result(prefix, id, error_result(id, 'expired', 'deadline_exceeded',
        'the deadline passed while the request was queued', h[2], h[3], now), ttl)
      redis.call('DEL', rkey)
      expired = expired + 1
    else
      local token = owner .. '/' .. attempt
      redis.call('HSET', rkey, 'st', 'inflight', 'a', attempt, 'o', owner, 't', token,
        'cl', num(now))
      redis.call('ZADD', inflight, num(now + lease), id)
      out[#out + 1] = {id, h[1], token, attempt, h[3], h[4] or ''}
    end
  end
end
if expired > 0 then count_done(stats, 'expired', expired, now) end
if broken > 0 then count_done(stats, 'failed', broken, now) end
if redis.call('ZCARD', pending) == 0 then redis.call('DEL', wake) end
local next_due = -1
local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if first[2] then next_due = math.max(tonumber(first[2]) - now, 0) end
return {num(now), out, expired, next_due}
"""

HEARTBEAT = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 workers
-- ARGV: 1 prefix, 2 worker id, 3 lease ms, 4 liveness ms, then pairs: id, token
-- Extends every lease whose token still matches and marks the worker alive.
-- Returns the ids whose lease was lost (reclaimed or finished elsewhere).
local inflight, workers = KEYS[1], KEYS[2]
local prefix, worker = ARGV[1], ARGV[2]
local lease, liveness = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
redis.call('ZADD', workers, num(now + liveness), worker)
redis.call('ZREMRANGEBYSCORE', workers, '-inf', num(now - 60000))
local lost = {}
for i = 5, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', prefix .. 'req:' .. id, 't') == token then
    redis.call('ZADD', inflight, 'XX', num(now + lease), id)
  else
    lost[#lost + 1] = id
  end
end
return lost
"""

COMPLETE = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 stats, 3 delayed, 4 dead, 5 wake
-- ARGV: 1 prefix, 2 result ttl ms, 3 dead-letter cap,
--       then per request 5 values: id, token, status, result body, retry delay ms
-- Token-checked and first writer wins: a zombie (a worker whose lease was taken over) or a
-- request cancelled meanwhile gets its write refused. Status 'retry' puts the request in the
-- delayed set for the given backoff (attempt kept; claim promotes it when due); 'dead' writes
-- the body as the final result and dead-letters the id; any other status is final.
-- A retry also pushes a wake token, so an idle worker learns when the retry falls due.
-- Returns 1 (done) or 0 (refused) per request.
local inflight, stats, delayed, dead, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, ttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local out, refused, counts, retried = {}, 0, {}, 0
for i = 4, #ARGV, 5 do
  local id, token, status = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local rkey = prefix .. 'req:' .. id
  local ok = 0
  if redis.call('HGET', rkey, 't') == token then
    if status == 'retry' then
      redis.call('ZREM', inflight, id)
      redis.call('HSET', rkey, 'st', 'delayed')
      redis.call('HDEL', rkey, 'o', 't')
      redis.call('ZADD', delayed, num(now + tonumber(ARGV[i + 4])), id)
      retried = retried + 1
      ok = 1
    elseif put_result(prefix, id, ARGV[i + 3], ttl) == 1 then
      if status == 'dead' then
        redis.call('ZADD', dead, num(now), id)
        redis.call('ZREMRANGEBYRANK', dead, 0, -(cap + 1))
      end
      redis.call('DEL', rkey)
      redis.call('ZREM', inflight, id)
      counts[status] = (counts[status] or 0) + 1
      ok = 1
    end
  end
  if ok == 0 then refused = refused + 1 end
  out[#out + 1] = ok
end
for status, n in pairs(counts) do count_done(stats, status, n, now) end
if refused > 0 then redis.call('HINCRBY', stats, 'refused', refused) end
if retried > 0 then
  redis.call('HINCRBY', stats, 'retried', retried)
  wake_workers(wake, 1)
end
return out
"""

RECLAIM = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 pending, 3 dead, 4 wake, 5 stats
-- ARGV: 1 prefix, 2 max count, 3 result ttl ms, 4 dead-letter cap
-- Expired leases go back to pending with their original score, or, once their attempts are
-- used up, to the capped dead-letter set with an error result. Returns {requeued, dead}.
local inflight, pending, dead, wake, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, max_n = ARGV[1], tonumber(ARGV[2])
local ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', inflight, '-inf', num(now), 'LIMIT', 0, max_n)
local requeued, died = 0, 0
for _, id in ipairs(ids) do
  redis.call('ZREM', inflight, id)
  local rkey = prefix .. 'req:' .. id
  local h = redis.call('HMGET', rkey, 's', 'a', 'ma', 'eq', 'o')
  if h[1] then
    if tonumber(h[2]) >= tonumber(h[3]) then
      put_result(prefix, id, error_result(id, 'dead', 'max_attempts',
        'lease expired on all ' .. h[2] .. ' attempts (last owner ' .. (h[5] or '?') .. ')',
        h[2], h[4], now), ttl)
      redis.call('ZADD', dead, num(now), id)
      redis.call('ZREMRANGEBYRANK', dead, 0, -(cap + 1))
      redis.call('DEL', rkey)
      died = died + 1
    else
      redis.call('HSET', rkey, 'st', 'pending')
      redis.call('HDEL', rkey, 'o', 't')
      redis.call('ZADD', pending, h[1], id)
      requeued = requeued + 1
    end
  end
end
if requeued > 0 then
  redis.call('HINCRBY', stats, 'reclaimed', requeued)
  wake_workers(wake, requeued)
end
if died > 0 then count_done(stats, 'dead', died, now) end
return {requeued, died}
"""

RELEASE = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 pending, 3 wake
-- ARGV: 1 prefix, then pairs: id, token
-- Gives claims that never started back to pending at once (clean shutdown), with their original
-- score and the attempt not counted. Returns how many were released.
local inflight, pending, wake = KEYS[1], KEYS[2], KEYS[3]
local prefix = ARGV[1]
local released = 0
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rkey = prefix .. 'req:' .. id
  local h = redis.call('HMGET', rkey, 't', 's')
  if h[1] == token then
    redis.call('HINCRBY', rkey, 'a', -1)
    redis.call('HSET', rkey, 'st', 'pending')
    redis.call('HDEL', rkey, 'o', 't')
    redis.call('ZREM', inflight, id)
    redis.call('ZADD', pending, h[2], id)
    released = released + 1
  end
end
if released > 0 then wake_workers(wake, released) end
return released
"""

CANCEL = _PRELUDE + r"""
-- KEYS: 1 pending, 2 inflight, 3 stats, 4 delayed
-- ARGV: 1 prefix, 2 id, 3 result ttl ms
-- Cancels a queued, delayed or running request: writes a 'cancelled' result (which also
-- refuses a later completion of a running one). A running request's id is pushed onto its
-- owner's cancel list (expiring with CANCEL_NOTICE_TTL_MS, so a dead owner's list goes away):
-- a generate worker blocks on it and frees the slot at its next decode step.
-- Returns 'cancelled', 'done' (already finished) or 'unknown'.
local pending, inflight, stats, delayed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, id, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local CANCEL_NOTICE_TTL_MS = 60000
local rkey = prefix .. 'req:' .. id
local h = redis.call('HMGET', rkey, 'a', 'eq', 'o')
if not h[2] then
  if redis.call('EXISTS', prefix .. 'result:' .. id) == 1 then return 'done' end
  return 'unknown'
end
local now = now_ms()
redis.call('ZREM', pending, id)
if redis.call('ZREM', inflight, id) == 1 and h[3] then
  local notice = prefix .. 'cancels:' .. h[3]
  redis.call('RPUSH', notice, id)
  redis.call('PEXPIRE', notice, CANCEL_NOTICE_TTL_MS)
end
redis.call('ZREM', delayed, id)
put_result(prefix, id, error_result(id, 'cancelled', 'cancelled', 'cancelled by the producer',
  h[1], h[2], now), ttl)
redis.call('DEL', rkey)
count_done(stats, 'cancelled', 1, now)
return 'cancelled'
"""

STREAM = _PRELUDE + r"""
-- KEYS: 1 inflight (names the queue's slot; per-request keys are built from prefix)
-- ARGV: 1 prefix, 2 ttl ms, then per request 5 values: id, token, attempt, delta text,
--       the ids of the tokens generated since the last write (decimal, space-separated)
-- Called by a generating worker once per decode step for every request it runs. A request
-- whose lease token still matches gets its delta appended to its stream (nothing is appended
-- when there are neither text nor tokens: the call then only checks the lease). A request
-- whose token no longer matches was cancelled, finished elsewhere or reclaimed: nothing is
-- appended, its id is returned, and when its result exists an end marker is appended so
-- readers stop waiting.
-- Stream entries: a = attempt, d = text delta, k = token ids (a retried or reclaimed
-- generation goes on from them); e = 1 marks the end (the result exists).
-- Returns the ids whose lease was lost.
local prefix, ttl = ARGV[1], tonumber(ARGV[2])
local lost = {}
for i = 3, #ARGV, 5 do
  local id, token, attempt, delta, toks = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
    ARGV[i + 4]
  local skey = prefix .. 'stream:' .. id
  if redis.call('HGET', prefix .. 'req:' .. id, 't') == token then
    if delta ~= '' or toks ~= '' then
      redis.call('XADD', skey, '*', 'a', attempt, 'd', delta, 'k', toks)
      redis.call('PEXPIRE', skey, ttl)
    end
  else
    lost[#lost + 1] = id
    if redis.call('EXISTS', prefix .. 'result:' .. id) == 1 then
      redis.call('XADD', skey, '*', 'e', 1)
      redis.call('PEXPIRE', skey, ttl)
    end
  end
end
return lost
"""

STREAM_END = r"""
-- KEYS: 1 inflight (names the queue's slot)
-- ARGV: 1 prefix, 2 ttl ms, then ids
-- After a generating worker's complete call: appends the end marker (e = 1) to the stream of
-- each id whose result exists, so readers blocked in XREAD stop waiting. Returns how many.
local prefix, ttl = ARGV[1], tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('EXISTS', prefix .. 'result:' .. id) == 1 then
    local skey = prefix .. 'stream:' .. id
    redis.call('XADD', skey, '*', 'e', 1)
    redis.call('PEXPIRE', skey, ttl)
    n = n + 1
  end
end
return n
"""

ALL: dict[str, str] = {
    "enqueue": ENQUEUE,
    "claim": CLAIM,
    "heartbeat": HEARTBEAT,
    "complete": COMPLETE,
    "reclaim": RECLAIM,
    "release": RELEASE,
    "cancel": CANCEL,
    "stream": STREAM,
    "stream_end": STREAM_END,
}
