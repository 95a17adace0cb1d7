"""The Lua script of the per-tenant limits (``limits``): one atomic call in the tenancy slot
(``TenancyKeys``: each tenant's bucket hash, in-flight sorted set and reservations hash) that
carries every admission and settlement a gateway's event-loop turn made, for any tenants, one
after the other (each sees the state the ones before it left). Time comes from Redis
``TIME``, read once per call, so every gateway replica reads one clock.

* KEYS: three per tenant the call touches: its bucket (``rq``, ``tk``: bucket levels; ``ts``:
  their last refill, ms; ``qb``: bytes held), its in-flight set (id -> expiry ms), its
  reservations (id -> ``"<tokens> <bytes>"``)
* ARGV[1]: the calls, packed into one msgpack array (one argument for redis-py to encode and
  send, whatever the calls and ids): each ``[kind, k, args]``, kind ``"admit"`` or
  ``"settle"``, k the index in KEYS of the tenant's first key, args as below
* returns one reply per call, in order

An admission (``admit``) reads everything and decides before its first write: a refusal writes
nothing (expired reservations are then left for the next admission, which ignores them in its
counts anyway). Its args: [1] requests per minute, [2] tokens per minute, [3] max in flight,
[4] max queued bytes (0: no such limit), [5] ttl ms, [6] m, [7..6+2m] rows of 2: id, actual
tokens (settlements carried by this admission, applied first, as a settlement would, and kept
even when the admission is refused), then rows of 3: id, tokens, bytes. It returns {admitted
0/1, refused limit or '', retry ms, requests left, requests reset ms, tokens left, tokens
reset ms, in flight, queued bytes}.

An id that already holds a live reservation is admitted again without a charge (a repeated
idempotent request is one request). A bucket holds at most its per-minute capacity and refills
continuously (capacity per 60,000 ms).

A settlement (``settle``) gives back, per id that still holds a reservation, its reserved
tokens minus the actual ones (the bucket never above its capacity, nor below minus it), frees
its bytes and its in-flight slot, and deletes the reservation: a second settlement of the id
finds none and does nothing. Its args: [1] requests per minute, [2] tokens per minute, [3..]
rows of 2: id, actual tokens ('' : unknown, the reservation stands). It returns the number of
ids settled.

Every call's shape is checked before the first one runs: a malformed call fails the whole
script with nothing written.
"""

from __future__ import annotations

#: Expired reservations one admission drops at most (the rest go with the next ones).
PURGE = 256

# The state of one tenant, at the top of both functions.
_COMMON = """local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local st = redis.call('HMGET', bucket, 'rq', 'tk', 'ts', 'qb')
local elapsed = math.max(0, now - (tonumber(st[3]) or now))
local function level(v, cap)
  if cap <= 0 then return 0 end
  local x = tonumber(v)
  if x == nil then return cap end
  return math.min(cap, x + elapsed * cap / 60000)
end
local function fmt(x) return string.format('%.3f', x) end
local rq, tk, qb = level(st[1], rpm), level(st[2], tpm), tonumber(st[4]) or 0
-- settle ARGV[from..to], rows of 2 (id, actual tokens; '' unknown): drop the reservations
-- still held; returns the tokens to give back, the bytes freed and the ids settled
local function settle_rows(from, to)
  local ids = {}
  for i = from, to, 2 do ids[#ids + 1] = ARGV[i] end
  local back, freed, done = 0, 0, {}
  if #ids == 0 then return back, freed, done end
  local held = redis.call('HMGET', reserved, unpack(ids))
  for k, id in ipairs(ids) do
    if held[k] then
      local tok, size = string.match(held[k], '^(%-?%d+) (%-?%d+)$')
      local actual = tonumber(ARGV[from + 2 * k - 1])
      if actual and tok then back = back + tonumber(tok) - actual end
      freed = freed + (tonumber(size) or 0)
      done[#done + 1] = id
    end
  end
  if #done > 0 then
    redis.call('HDEL', reserved, unpack(done))
    redis.call('ZREM', flight, unpack(done))
  end
  return back, freed, done
end
"""

_ADMIT = """
local max_flight, max_bytes, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local m = tonumber(ARGV[6])
local first = 7 + 2 * m
local settled = 0
if m > 0 then
  local back, freed, done = settle_rows(7, first - 1)
  settled = #done
  if settled > 0 then
    if tpm > 0 then tk = math.max(-tpm, math.min(tpm, tk + back)) end
    qb = math.max(0, qb - freed)
  end
end
local expired = redis.call('ZRANGEBYSCORE', flight, '-inf', now, 'LIMIT', 0, PURGE)
local stale = {}
if #expired > 0 then
  local held = redis.call('HMGET', reserved, unpack(expired))
  for i, id in ipairs(expired) do
    stale[id] = true
    if held[i] then qb = qb - (tonumber(string.match(held[i], ' (%-?%d+)$')) or 0) end
  end
end
if qb < 0 then qb = 0 end
local asked = {}
for i = first, #ARGV, 3 do asked[#asked + 1] = ARGV[i] end
local ids, toks, sizes, n, need_t, need_b = {}, {}, {}, 0, 0, 0
if #asked > 0 then
  local held = redis.call('HMGET', reserved, unpack(asked))
  for k, id in ipairs(asked) do
    if not held[k] or stale[id] then
      n = n + 1
      ids[n] = id
      toks[n] = tonumber(ARGV[first + 3 * k - 2])
      sizes[n] = tonumber(ARGV[first + 3 * k - 1])
      need_t, need_b = need_t + toks[n], need_b + sizes[n]
    end
  end
end
local live = redis.call('ZCOUNT', flight, '(' .. now, '+inf')
local limit, wait = '', 0
local function refuse(name, ms)
  if limit == '' then limit = name end
  if ms > wait then wait = ms end
end
local reset_rq, reset_tk = 0, 0
if rpm > 0 and n > 0 then
  if n > rpm then refuse('requests', 60000); reset_rq = 60000
  elseif rq < n then reset_rq = math.ceil((n - rq) * 60000 / rpm); refuse('requests', reset_rq)
  end
end
if tpm > 0 and need_t > 0 then
  if need_t > tpm then refuse('tokens', 60000); reset_tk = 60000
  elseif tk < need_t then
    reset_tk = math.ceil((need_t - tk) * 60000 / tpm); refuse('tokens', reset_tk)
  end
end
if max_flight > 0 and n > 0 and live + n > max_flight then refuse('in_flight', 1000) end
if max_bytes > 0 and n > 0 and qb + need_b > max_bytes then refuse('queued_bytes', 1000) end
if limit == '' and n > 0 then
  if #expired > 0 then
    redis.call('ZREM', flight, unpack(expired))
    redis.call('HDEL', reserved, unpack(expired))
  end
  local scored, held = {}, {}
  for k = 1, n do
    scored[#scored + 1] = now + ttl
    scored[#scored + 1] = ids[k]
    held[#held + 1] = ids[k]
    held[#held + 1] = toks[k] .. ' ' .. sizes[k]
  end
  redis.call('ZADD', flight, unpack(scored))
  redis.call('HSET', reserved, unpack(held))
  qb, live = qb + need_b, live + n
  local fields = {'ts', now, 'qb', qb}
  if rpm > 0 then rq = rq - n; fields[#fields + 1] = 'rq'; fields[#fields + 1] = fmt(rq) end
  if tpm > 0 then
    tk = tk - need_t; fields[#fields + 1] = 'tk'; fields[#fields + 1] = fmt(tk)
  end
  redis.call('HSET', bucket, unpack(fields))
  for _, key in ipairs({bucket, flight, reserved}) do redis.call('PEXPIRE', key, ttl + 60000) end
end
if (limit ~= '' or n == 0) and settled > 0 and st[3] then
  local fields = {'ts', now, 'qb', qb}
  if rpm > 0 then fields[#fields + 1] = 'rq'; fields[#fields + 1] = fmt(rq) end
  if tpm > 0 then fields[#fields + 1] = 'tk'; fields[#fields + 1] = fmt(tk) end
  redis.call('HSET', bucket, unpack(fields))
end
if limit == '' then
  if rpm > 0 then reset_rq = math.ceil((rpm - rq) * 60000 / rpm) end
  if tpm > 0 then reset_tk = math.ceil((tpm - tk) * 60000 / tpm) end
end
return {limit == '' and 1 or 0, limit, wait, math.floor(rq), reset_rq, math.floor(tk),
        reset_tk, live, qb}
"""

_SETTLE = """
local back, freed, done = settle_rows(3, #ARGV)
if #done == 0 then return 0 end
if not st[3] then return #done end  -- no bucket left: it is full, and holds no bytes
local fields = {'ts', now, 'qb', math.max(0, qb - freed)}
if rpm > 0 then fields[#fields + 1] = 'rq'; fields[#fields + 1] = fmt(rq) end
if tpm > 0 then
  fields[#fields + 1] = 'tk'
  fields[#fields + 1] = fmt(math.max(-tpm, math.min(tpm, tk + back)))
end
redis.call('HSET', bucket, unpack(fields))
return #done
"""

_DISPATCH = """
local ok, calls = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(calls) ~= 'table' then
  return redis.error_reply('ERR inferq limits: bad arguments')
end
for _, c in ipairs(calls) do
  local at = type(c) == 'table' and tonumber(c[2])
  local kind = type(c) == 'table' and c[1]
  if not (at and (kind == 'admit' or kind == 'settle') and type(c[3]) == 'table'
          and KEYS[at + 2]) then
    return redis.error_reply('ERR inferq limits: bad arguments')
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, c in ipairs(calls) do
  local run = c[1] == 'admit' and admit or settle
  out[i] = run(KEYS[c[2]], KEYS[c[2] + 1], KEYS[c[2] + 2], c[3], now)
end
return out
"""

LIMITS = (f"local PURGE = {PURGE}\n"
          "local function admit(bucket, flight, reserved, ARGV, now)\n" + _COMMON + _ADMIT
          + "end\nlocal function settle(bucket, flight, reserved, ARGV, now)\n" + _COMMON
          + _SETTLE + "end\n" + _DISPATCH)
