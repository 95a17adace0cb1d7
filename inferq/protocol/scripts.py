"""The Lua scripts: every state change of a request is exactly one of these atomic calls.

Each script reads the time from Redis ``TIME`` (one clock for every producer and worker) and
builds per-request keys from ``prefix`` (``inferq:{task:model}:``), so every key it touches
shares the queue shard's hash tag and lives in one cluster slot (see ``keys``).

Request hash ``<prefix>req:<id>`` fields: ``p`` payload (msgpack), ``s`` pending score,
``st`` state (``pending``/``inflight``/``delayed`` awaiting a retry), ``a`` attempts used by
runs that ended (failed and retried, or lost with their worker), ``ma`` max attempts, ``eq``
enqueue time (ms), ``dl`` absolute deadline (ms, optional), ``rt`` reply inbox (optional),
``o`` owner, ``t`` lease token, ``cl`` claim time (ms). The set ``started`` holds the ids
whose current claim has started running (``START``): a run in progress is attempt ``a + 1``.

The hash exists exactly until a result is written: every script that writes a result deletes
the hash in the same call, and enqueue refuses an id whose result still exists. So a matching
lease token (a field of the hash) proves that no result exists yet: first writer wins without
an ``EXISTS`` per request.

Result ``<prefix>result:<id>`` is a list holding one msgpack result with a TTL; waiters block
on it with ``BLMOVE key key`` (a rotation that leaves it in place), so a waiting producer is
woken by the write itself: no polling, no pub/sub message to drop.

Validation. Redis has no rollback: a script that raises keeps what it wrote before. So each
script reads every field it acts on (``HMGET`` through ``redis.pcall``, so a key of another type
than a hash is noticed, not raised on) and checks it (``int``: a finite integer in range)
before it writes. A request whose fields are damaged fails alone with a ``corrupt_request``
result; raw keys that cannot be tied to a request (a member with no hash, a hash with neither
payload nor enqueue time) are dropped, counted in the stats hash (``garbage``) and returned to
the worker, which logs them. Writes to per-request keys that could hold another type (a result
or inbox key written by hand) go through ``redis.pcall`` and replace the damaged key.
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
local MAXI = 9007199254740991
-- x as an integer in [lo, hi], or nil: missing, not a number, fractional, NaN, huge
local function int(x, lo, hi)
  if x == nil or x == false then return nil end
  local n = tonumber(x)
  if n == nil or n ~= n or n ~= math.floor(n) or n < (lo or -MAXI) or n > (hi or MAXI) then
    return nil
  end
  return n
end
local MAX_ATTEMPTS = 1000
-- HMGET that never raises: nil when the key holds another type than a hash
local function fields(key, ...)
  local r = redis.pcall('HMGET', key, ...)
  if r.err then return nil end
  return r
end
local CHUNK = 1000
-- The per-request values of a call, packed by the caller into one msgpack array (a flat run of
-- `width` values per request: one argument instead of thousands, see ``ops.packed``): the
-- array, or nil when it is not an array whose length is a multiple of width. Each script
-- checks the type of every value it uses in its read pass, before its first write.
local function rows(blob, width)
  local ok, t = pcall(cmsgpack.unpack, blob or '')
  if not ok or type(t) ~= 'table' or #t % width ~= 0 then return nil end
  return t
end
local function strings(a, b) return type(a) == 'string' and type(b) == 'string' end
-- one command per CHUNK elements of list (after the fixed arguments in head)
local function bulk(cmd, key, list, opt)
  for i = 1, #list, CHUNK do
    if opt then
      redis.call(cmd, key, opt, unpack(list, i, math.min(i + CHUNK - 1, #list)))
    else
      redis.call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
    end
  end
end
-- a write to a per-request key that may have been overwritten by hand with another type:
-- the damaged key is replaced
local function force(cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    redis.call('DEL', key)
    redis.call(cmd, key, ...)
  end
end
-- Results: written once per request (the caller holds the proof that none exists yet: see the
-- module docstring); those whose request named a reply inbox (an async client waiting on many
-- results over one connection) are also pushed there as "<id> <result>" (ids never contain a
-- space), once per inbox per call by flush_inboxes, which trims and expires each inbox once.
local INBOX_CAP = 100000
local inboxes, inbox_order = {}, {}
local function put_result(prefix, id, body, ttl, rt)
  local k = prefix .. 'result:' .. id
  force('RPUSH', k, body)
  redis.call('PEXPIRE', k, ttl)
  if rt and rt ~= '' then
    local l = inboxes[rt]
    if not l then
      l = {}
      inboxes[rt] = l
      inbox_order[#inbox_order + 1] = rt
    end
    l[#l + 1] = id .. ' ' .. body
  end
end
local function flush_inboxes(prefix, ttl)
  for _, rt in ipairs(inbox_order) do
    local inbox = prefix .. 'inbox:' .. rt
    local l = inboxes[rt]
    for i = 1, #l, CHUNK do
      force('RPUSH', inbox, unpack(l, i, math.min(i + CHUNK - 1, #l)))
    end
    redis.call('LTRIM', inbox, -INBOX_CAP, -1)
    redis.call('PEXPIRE', inbox, ttl)
  end
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
    local ts = int(redis.call('HGET', stats, 'ts:' .. slot)) or 0
    if ts >= sec - 10 and ts < sec then
      total = total + (int(redis.call('HGET', stats, 'n:' .. slot)) or 0)
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
-- attempts and enqueued: validated integers, or nil (left out of the result)
local function error_result(id, status, code, message, attempts, enqueued, now)
  return cmsgpack.pack({v = 1, id = id, status = status,
    error = {code = code, message = message},
    attempts = attempts or 0, enqueued_ms = enqueued, finished_ms = now})
end
-- the checked fields of a request hash read as HMGET p s a ma eq dl rt (h: its reply, or nil
-- for a key of another type). Returns kind, r: kind 'ok' (r: the numbers), 'garbage' (no
-- payload and no enqueue time: nothing ties it to a request) or 'corrupt' (r.why says what).
local function check(h)
  if not h then return 'corrupt', {why = 'the request key is not a hash'} end
  if not h[1] and not h[5] then return 'garbage', {} end
  local r = {p = h[1], rt = h[7] or nil}
  r.a = int(h[3], 0, MAX_ATTEMPTS)
  r.eq = int(h[5], 0, MAXI)
  if not h[1] then r.why = 'it has no payload'
  elseif not int(h[2], 0, MAXI) then r.why = 'its score is not an integer'
  elseif not r.a then r.why = 'its attempt count is not an integer >= 0'
  elseif not int(h[4], 1, MAX_ATTEMPTS) then r.why = 'its max attempts is not an integer >= 1'
  elseif r.a >= tonumber(h[4]) then r.why = 'its attempts are already used up'
  elseif not r.eq then r.why = 'its enqueue time is not an integer'
  elseif h[6] and not int(h[6], 0, MAXI) then r.why = 'its deadline is not an integer'
  end
  if r.why then return 'corrupt', r end
  r.s, r.ma, r.dl = h[2], tonumber(h[4]), h[6] and tonumber(h[6]) or nil
  return 'ok', r
end
local FIELDS = {'p', 's', 'a', 'ma', 'eq', 'dl', 'rt'}
-- answers a damaged request with a corrupt_request result and deletes its key
local function fail_corrupt(prefix, id, r, now, ttl)
  put_result(prefix, id, error_result(id, 'failed', 'corrupt_request',
    'the stored request is damaged: ' .. r.why, r.a, r.eq, now), ttl, r.rt)
  redis.call('DEL', prefix .. 'req:' .. id)
end
-- counts requests answered corrupt_request and garbage keys dropped
local function count_bad(stats, corrupt, garbage, now)
  if corrupt > 0 then
    count_done(stats, 'failed', corrupt, now)
    redis.call('HINCRBY', stats, 'corrupt', corrupt)
  end
  if garbage > 0 then redis.call('HINCRBY', stats, 'garbage', garbage) end
end
"""

ENQUEUE = _PRELUDE + r"""
-- KEYS: 1 pending, 2 seq, 3 wake, 4 stats
-- ARGV: 1 prefix, then per request 7 values: id, priority band, payload,
--       relative deadline ms or '', max attempts, reply inbox or '',
--       depth limit for this request's priority (0 = unbounded); then, optionally, one
--       last value 'atomic': all or none, if any new request would be refused (shed), every
--       new request is refused and nothing is written
-- Returns {depth, {outcome per request}, retry_after_ms}; each outcome is
-- 'queued', 'pending', 'inflight', 'delayed', 'done' (a repeated id) or 'full' (shed:
-- the queue is at the depth limit of that priority). retry_after_ms estimates when the
-- excess drains at the recent completion rate.
-- Reads and checks everything, then takes one block of sequence numbers (INCRBY) and writes
-- each queued request with one HSET and all of them with one ZADD.
local pending, seqkey, wake, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = ARGV[1]
local n = #ARGV
local atomic = (n - 1) % 7 == 1 and ARGV[n] == 'atomic'
if atomic then n = n - 1 end
for i = 2, n, 7 do
  if not (int(ARGV[i + 1], 0, MAXI) and (ARGV[i + 3] == '' or int(ARGV[i + 3], 1, MAXI))
          and int(ARGV[i + 4], 1, MAX_ATTEMPTS) and int(ARGV[i + 6], 0, MAXI)) then
    return redis.error_reply('ERR inferq enqueue: bad arguments for ' .. tostring(ARGV[i]))
  end
end
local now = now_ms()
local depth = redis.call('ZCARD', pending)
local out, queue, seen, worst_excess = {}, {}, {}, 0
local STATES = {pending = true, inflight = true, delayed = true}
for i = 2, n, 7 do
  local id = ARGV[i]
  local rkey = prefix .. 'req:' .. id
  local limit = tonumber(ARGV[i + 6])
  if seen[id] then
    out[#out + 1] = 'pending'  -- a repeat within this call
  elseif redis.call('EXISTS', rkey, prefix .. 'result:' .. id) > 0 then
    local st = redis.pcall('HGET', rkey, 'st')
    if type(st) == 'string' and STATES[st] then
      out[#out + 1] = st
    elseif redis.call('EXISTS', prefix .. 'result:' .. id) == 1 then
      out[#out + 1] = 'done'
    else
      out[#out + 1] = 'pending'  -- a damaged hash: whoever meets it answers it
    end
  elseif limit > 0 and depth >= limit then
    out[#out + 1] = 'full'
    if limit > 0 then worst_excess = math.max(worst_excess, depth - limit + 1) end
  else
    depth = depth + 1
    queue[#queue + 1] = i
    seen[id] = true
    out[#out + 1] = 'queued'
  end
end
if atomic and worst_excess > 0 then  -- one new request was shed: all of them are
  queue = {}
  for k = 1, #out do
    if out[k] == 'queued' or (out[k] == 'pending' and seen[ARGV[2 + 7 * (k - 1)]]) then
      out[k] = 'full'
    end
  end
end
if #queue > 0 then
  local last = redis.call('INCRBY', seqkey, #queue)
  local zadd = {}
  for n, i in ipairs(queue) do
    local score = num(tonumber(ARGV[i + 1]) + last - #queue + n)
    local h = {'p', ARGV[i + 2], 's', score, 'st', 'pending', 'a', 0, 'ma', ARGV[i + 4],
               'eq', num(now)}
    if ARGV[i + 3] ~= '' then
      h[#h + 1] = 'dl'
      h[#h + 1] = num(now + tonumber(ARGV[i + 3]))
    end
    if ARGV[i + 5] ~= '' then
      h[#h + 1] = 'rt'
      h[#h + 1] = ARGV[i + 5]
    end
    redis.call('HSET', prefix .. 'req:' .. ARGV[i], unpack(h))
    zadd[#zadd + 1] = score
    zadd[#zadd + 1] = ARGV[i]
  end
  bulk('ZADD', pending, zadd)
  wake_workers(wake, #queue)
end
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
-- ARGV: 1 prefix, 2 owner, 3 lease ms, 4 max count, 5 result ttl ms,
--       6 highest pending score to take ('' = any: a sharded claim takes one priority band)
-- First promotes retries whose backoff has passed from delayed to pending (original score),
-- each checked before it moves. Then reads up to max count ids from the head of pending and
-- checks each request's fields; only then writes: the valid ones move to inflight (score =
-- lease deadline) with owner and a fresh lease token; the attempt count is not touched (START
-- counts runs). A request whose deadline already passed is answered 'expired' and never runs;
-- a damaged one is answered 'corrupt_request'; garbage is dropped and counted. When pending is
-- left empty the wake list is cleared, so stale tokens never accumulate.
-- Returns {now, {{id, payload, token, attempt (this run's number), enqueued ms,
-- deadline ms or ''}, ...}, expired, ms until the next delayed retry is due or -1,
-- {corrupt id, reason, ...}, {garbage key, ...}}.
local pending, inflight, stats, delayed, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, owner = ARGV[1], ARGV[2]
local lease, max_n, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local top = ARGV[6]
if top == nil or top == '' then top = '+inf' end
local now = now_ms()
local corrupt, garbage = {}, {}
-- 1. due retries
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', num(now), 'LIMIT', 0, 1000)
if #due > 0 then
  local checked = {}
  for i, id in ipairs(due) do
    checked[i] = {check(fields(prefix .. 'req:' .. id, unpack(FIELDS)))}
  end
  local zadd = {}
  for i, id in ipairs(due) do
    local kind, r = checked[i][1], checked[i][2]
    if kind == 'ok' then
      redis.call('HSET', prefix .. 'req:' .. id, 'st', 'pending')
      zadd[#zadd + 1] = r.s
      zadd[#zadd + 1] = id
    elseif kind == 'corrupt' then
      fail_corrupt(prefix, id, r, now, ttl)
      corrupt[#corrupt + 1] = id
      corrupt[#corrupt + 1] = r.why
    else
      redis.call('DEL', prefix .. 'req:' .. id)
      garbage[#garbage + 1] = prefix .. 'req:' .. id
    end
  end
  bulk('ZREM', delayed, due)
  bulk('ZADD', pending, zadd)
end
-- 2. the claim: read and check the window, then write
local ids = redis.call('ZRANGEBYSCORE', pending, '-inf', top, 'LIMIT', 0, max_n)
local checked = {}
for i, id in ipairs(ids) do
  checked[i] = {check(fields(prefix .. 'req:' .. id, unpack(FIELDS)))}
end
local out, expired, leases = {}, 0, {}
local deadline, now_s = num(now + lease), num(now)
for i, id in ipairs(ids) do
  local kind, r = checked[i][1], checked[i][2]
  local rkey = prefix .. 'req:' .. id
  if kind == 'ok' and r.dl and r.dl <= now then
    put_result(prefix, id, error_result(id, 'expired', 'deadline_exceeded',
      'the deadline passed while the request was queued', r.a, r.eq, now), ttl, r.rt)
    redis.call('DEL', rkey)
    expired = expired + 1
  elseif kind == 'ok' then
    local attempt = r.a + 1
    local token = owner .. '/' .. attempt .. '/' .. now_s
    redis.call('HSET', rkey, 'st', 'inflight', 'o', owner, 't', token, 'cl', now_s)
    leases[#leases + 1] = deadline
    leases[#leases + 1] = id
    out[#out + 1] = {id, r.p, token, attempt, num(r.eq), r.dl and num(r.dl) or ''}
  elseif kind == 'corrupt' then
    fail_corrupt(prefix, id, r, now, ttl)
    corrupt[#corrupt + 1] = id
    corrupt[#corrupt + 1] = r.why
  else
    redis.call('DEL', rkey)
    garbage[#garbage + 1] = rkey
  end
end
bulk('ZADD', inflight, leases)
bulk('ZREM', pending, ids)
flush_inboxes(prefix, ttl)
if expired > 0 then count_done(stats, 'expired', expired, now) end
count_bad(stats, #corrupt / 2, #garbage, now)
if redis.call('ZCARD', pending) == 0 then redis.call('DEL', wake) end
local next_due = -1
local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if first[2] then next_due = math.max(tonumber(first[2]) - now, 0) end
return {num(now), out, expired, next_due, corrupt, garbage}
"""

PEEK = r"""
-- KEYS: 1 pending, 2 delayed
-- Read-only: {lowest pending score or '', ms until the next delayed retry is due or -1}. A
-- worker of a sharded queue peeks at every shard before a claim round, to claim only the best
-- priority present.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local due = -1
if first[2] then due = math.max(tonumber(first[2]) - now, 0) end
return {head[2] or '', due}
"""

START = _PRELUDE + r"""
-- KEYS: 1 started
-- ARGV: 1 prefix, 2 msgpack array of pairs: id, token
-- Called by a worker right before the model runs these requests: marks each one whose lease
-- token still matches as started (its run now counts as an attempt if its lease is lost).
-- Returns the ids whose lease was lost (reclaimed, cancelled): the worker must not run them.
local prefix, a = ARGV[1], rows(ARGV[2], 2)
if not a then return redis.error_reply('ERR inferq start: bad arguments') end
local ok, lost = {}, {}
for i = 1, #a, 2 do
  local id, token = a[i], a[i + 1]
  if not strings(id, token) then return redis.error_reply('ERR inferq start: bad arguments') end
  local t = redis.pcall('HGET', prefix .. 'req:' .. id, 't')
  if t == token then ok[#ok + 1] = id else lost[#lost + 1] = id end
end
for i = 1, #ok, 1000 do
  redis.call('SADD', KEYS[1], unpack(ok, i, math.min(i + 999, #ok)))
end
return lost
"""

HEARTBEAT = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 workers
-- ARGV: 1 prefix, 2 worker id, 3 lease ms, 4 liveness ms, 5 msgpack array of pairs: id, token
-- Extends every lease whose token still matches and marks the worker alive.
-- Returns the ids whose lease was lost (reclaimed or finished elsewhere).
local inflight, workers = KEYS[1], KEYS[2]
local prefix, worker = ARGV[1], ARGV[2]
local lease, liveness = tonumber(ARGV[3]), tonumber(ARGV[4])
local a = rows(ARGV[5], 2)
if not a then return redis.error_reply('ERR inferq heartbeat: bad arguments') end
local now = now_ms()
local lost, renew = {}, {}
local deadline = num(now + lease)
for i = 1, #a, 2 do
  local id, token = a[i], a[i + 1]
  if not strings(id, token) then
    return redis.error_reply('ERR inferq heartbeat: bad arguments')
  end
  if redis.pcall('HGET', prefix .. 'req:' .. id, 't') == token then
    renew[#renew + 1] = deadline
    renew[#renew + 1] = id
  else
    lost[#lost + 1] = id
  end
end
redis.call('ZADD', workers, num(now + liveness), worker)
redis.call('ZREMRANGEBYSCORE', workers, '-inf', num(now - 60000))
bulk('ZADD', inflight, renew, 'XX')
return lost
"""

COMPLETE = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 stats, 3 delayed, 4 dead, 5 wake, 6 started
-- ARGV: 1 prefix, 2 result ttl ms, 3 dead-letter cap,
--       4 msgpack array of 5 values per request: id, token, status, result body, retry delay ms
-- Token-checked and first writer wins: a zombie (a worker whose lease was taken over) or a
-- request cancelled meanwhile gets its write refused. Status 'retry' puts the request in the
-- delayed set for the given backoff, its finished run counted in its attempts (claim promotes
-- it when due); 'dead' writes the body as the final result and dead-letters the id; any other
-- status is final and deletes the request hash. A retry also pushes a wake token, so an idle
-- worker learns when the retry falls due. Stats, inboxes and sets are written once per call.
-- Returns 1 (done) or 0 (refused) per request.
local inflight, stats, delayed, dead, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local started = KEYS[6]
local prefix, ttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local a = rows(ARGV[4], 5)
if not a then return redis.error_reply('ERR inferq complete: bad arguments') end
local now = now_ms()
-- read and check
local reads = {}
for i = 1, #a, 5 do
  if not (strings(a[i], a[i + 1]) and strings(a[i + 2], a[i + 3])) then
    return redis.error_reply('ERR inferq complete: bad arguments')
  end
  local h = fields(prefix .. 'req:' .. a[i], 't', 'rt', 'a', 'eq')
  local ok = h ~= nil and h[1] == a[i + 1]
  reads[#reads + 1] = {ok = ok, rt = ok and h[2] or nil, a = ok and int(h[3], 0, MAX_ATTEMPTS),
                       eq = ok and int(h[4], 0, MAXI) or nil,
                       delay = int(a[i + 4], 0, MAXI)}
end
-- write
local out, refused, counts, done, retry, deads, corrupt = {}, 0, {}, {}, {}, {}, {}
for n, r in ipairs(reads) do
  local i = 1 + (n - 1) * 5
  local id, status = a[i], a[i + 2]
  local rkey = prefix .. 'req:' .. id
  if not r.ok then
    refused = refused + 1
    out[n] = 0
  elseif status == 'retry' and r.a and r.delay then
    redis.call('HSET', rkey, 'st', 'delayed', 'a', r.a + 1)
    redis.call('HDEL', rkey, 'o', 't')
    retry[#retry + 1] = num(now + r.delay)
    retry[#retry + 1] = id
    done[#done + 1] = id
    out[n] = 1
  elseif status == 'retry' then
    fail_corrupt(prefix, id, {why = 'its attempt count is not an integer >= 0', a = r.a,
      eq = r.eq, rt = r.rt}, now, ttl)
    corrupt[#corrupt + 1] = id
    done[#done + 1] = id
    out[n] = 1
  else
    put_result(prefix, id, a[i + 3], ttl, r.rt)
    redis.call('DEL', rkey)
    if status == 'dead' then
      deads[#deads + 1] = num(now)
      deads[#deads + 1] = id
    end
    counts[status] = (counts[status] or 0) + 1
    done[#done + 1] = id
    out[n] = 1
  end
end
bulk('ZREM', inflight, done)
bulk('SREM', started, done)
flush_inboxes(prefix, ttl)
if #deads > 0 then
  bulk('ZADD', dead, deads)
  redis.call('ZREMRANGEBYRANK', dead, 0, -(cap + 1))
end
for status, c in pairs(counts) do count_done(stats, status, c, now) end
count_bad(stats, #corrupt, 0, now)
if refused > 0 then redis.call('HINCRBY', stats, 'refused', refused) end
if #retry > 0 then
  bulk('ZADD', delayed, retry)
  redis.call('HINCRBY', stats, 'retried', #retry / 2)
  wake_workers(wake, 1)
end
return out
"""

RECLAIM = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 pending, 3 dead, 4 wake, 5 stats, 6 started
-- ARGV: 1 prefix, 2 max count, 3 result ttl ms, 4 dead-letter cap
-- Expired leases. A request that never started (not in 'started') goes back to pending with
-- its original score and its attempts unchanged. One that started has used an attempt: at its
-- max attempts it is dead-lettered (capped set, 'max_attempts' error result), else it goes
-- back to pending with the attempt counted (so it runs alone next time). Damaged requests are
-- answered 'corrupt_request'; garbage (an inflight member without its hash) is dropped.
-- Returns {requeued, dead, {corrupt id, reason, ...}, {garbage key, ...}, requeued unstarted}.
local inflight, pending, dead, wake, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local started = KEYS[6]
local prefix, max_n = ARGV[1], tonumber(ARGV[2])
local ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', inflight, '-inf', num(now), 'LIMIT', 0, max_n)
local checked = {}
for i, id in ipairs(ids) do
  local h = fields(prefix .. 'req:' .. id, 'p', 's', 'a', 'ma', 'eq', 'dl', 'rt', 'o')
  local kind, r = check(h)
  r.ran = redis.call('SISMEMBER', started, id) == 1
  r.owner = h and h[8] or nil
  checked[i] = {kind, r}
end
local requeue, deads, corrupt, garbage = {}, {}, {}, {}
local died, unstarted = 0, 0
for i, id in ipairs(ids) do
  local kind, r = checked[i][1], checked[i][2]
  local rkey = prefix .. 'req:' .. id
  if kind == 'ok' then
    local used = r.a + (r.ran and 1 or 0)
    if used >= r.ma then
      put_result(prefix, id, error_result(id, 'dead', 'max_attempts',
        'lease expired on all ' .. used .. ' attempts (last owner ' .. (r.owner or '?') .. ')',
        used, r.eq, now), ttl, r.rt)
      redis.call('DEL', rkey)
      deads[#deads + 1] = num(now)
      deads[#deads + 1] = id
      died = died + 1
    else
      redis.call('HSET', rkey, 'st', 'pending', 'a', used)
      redis.call('HDEL', rkey, 'o', 't')
      requeue[#requeue + 1] = r.s
      requeue[#requeue + 1] = id
      if not r.ran then unstarted = unstarted + 1 end
    end
  elseif kind == 'corrupt' then
    fail_corrupt(prefix, id, r, now, ttl)
    corrupt[#corrupt + 1] = id
    corrupt[#corrupt + 1] = r.why
  else
    redis.call('DEL', rkey)
    garbage[#garbage + 1] = rkey
  end
end
bulk('ZREM', inflight, ids)
bulk('SREM', started, ids)
bulk('ZADD', pending, requeue)
flush_inboxes(prefix, ttl)
if #deads > 0 then
  bulk('ZADD', dead, deads)
  redis.call('ZREMRANGEBYRANK', dead, 0, -(cap + 1))
  count_done(stats, 'dead', died, now)
end
if #requeue > 0 then
  redis.call('HINCRBY', stats, 'reclaimed', #requeue / 2)
  wake_workers(wake, #requeue / 2)
end
count_bad(stats, #corrupt / 2, #garbage, now)
return {#requeue / 2, died, corrupt, garbage, unstarted}
"""

RELEASE = _PRELUDE + r"""
-- KEYS: 1 inflight, 2 pending, 3 wake, 4 started
-- ARGV: 1 prefix, 2 msgpack array of pairs: id, token
-- Gives claims that did not run back to pending at once (clean shutdown, a displaced window,
-- a generation that never reached the model), with their original score and no attempt
-- counted (a START is undone). A claim whose score is no longer readable is left to expire:
-- RECLAIM answers it. Returns how many were released.
local inflight, pending, wake, started = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, a = ARGV[1], rows(ARGV[2], 2)
if not a then return redis.error_reply('ERR inferq release: bad arguments') end
local back = {}
for i = 1, #a, 2 do
  local id, token = a[i], a[i + 1]
  if not strings(id, token) then return redis.error_reply('ERR inferq release: bad arguments') end
  local h = fields(prefix .. 'req:' .. id, 't', 's')
  if h and h[1] == token and int(h[2], 0, MAXI) then
    back[#back + 1] = {id, h[2]}
  end
end
local ids, zadd = {}, {}
for _, b in ipairs(back) do
  local rkey = prefix .. 'req:' .. b[1]
  redis.call('HSET', rkey, 'st', 'pending')
  redis.call('HDEL', rkey, 'o', 't')
  ids[#ids + 1] = b[1]
  zadd[#zadd + 1] = b[2]
  zadd[#zadd + 1] = b[1]
end
bulk('ZREM', inflight, ids)
bulk('SREM', started, ids)
bulk('ZADD', pending, zadd)
if #ids > 0 then wake_workers(wake, #ids) end
return #ids
"""

CANCEL = _PRELUDE + r"""
-- KEYS: 1 pending, 2 inflight, 3 stats, 4 delayed, 5 started
-- ARGV: 1 prefix, 2 id, 3 result ttl ms
-- Cancels a queued, delayed or running request: writes a 'cancelled' result (which also
-- refuses a later completion of a running one). A running request's id is pushed onto its
-- owner's cancel list (expiring with CANCEL_NOTICE_TTL_MS, so a dead owner's list goes away):
-- a generate worker blocks on it and frees the slot at its next decode step.
-- Returns 'cancelled', 'done' (already finished) or 'unknown'.
local pending, inflight, stats, delayed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local started = KEYS[5]
local prefix, id, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local CANCEL_NOTICE_TTL_MS = 60000
local rkey = prefix .. 'req:' .. id
if redis.call('EXISTS', rkey) == 0 then
  if redis.call('EXISTS', prefix .. 'result:' .. id) == 1 then return 'done' end
  return 'unknown'
end
local h = fields(rkey, 'a', 'eq', 'o', 'rt') or {}
local owner = type(h[3]) == 'string' and h[3] or nil
local now = now_ms()
redis.call('ZREM', pending, id)
if redis.call('ZREM', inflight, id) == 1 and owner then
  local notice = prefix .. 'cancels:' .. owner
  force('RPUSH', notice, id)
  redis.call('PEXPIRE', notice, CANCEL_NOTICE_TTL_MS)
end
redis.call('ZREM', delayed, id)
if started then redis.call('SREM', started, id) end
put_result(prefix, id, error_result(id, 'cancelled', 'cancelled', 'cancelled by the producer',
  int(h[1], 0, MAX_ATTEMPTS), int(h[2], 0, MAXI), now), ttl, h[4] or nil)
redis.call('DEL', rkey)
flush_inboxes(prefix, ttl)
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
  if redis.pcall('HGET', prefix .. 'req:' .. id, 't') == token then
    if delta ~= '' or toks ~= '' then
      force('XADD', skey, '*', 'a', attempt, 'd', delta, 'k', toks)
      redis.call('PEXPIRE', skey, ttl)
    end
  else
    lost[#lost + 1] = id
    if redis.call('EXISTS', prefix .. 'result:' .. id) == 1 then
      force('XADD', skey, '*', 'e', 1)
      redis.call('PEXPIRE', skey, ttl)
    end
  end
end
return lost
"""

STREAM_END = _PRELUDE + r"""
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
    force('XADD', skey, '*', 'e', 1)
    redis.call('PEXPIRE', skey, ttl)
    n = n + 1
  end
end
return n
"""

ALL: dict[str, str] = {
    "enqueue": ENQUEUE,
    "claim": CLAIM,
    "peek": PEEK,
    "start": START,
    "heartbeat": HEARTBEAT,
    "complete": COMPLETE,
    "reclaim": RECLAIM,
    "release": RELEASE,
    "cancel": CANCEL,
    "stream": STREAM,
    "stream_end": STREAM_END,
}
