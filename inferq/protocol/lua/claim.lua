--[[
  Claims up to N requests from the head of pending for one worker.

  Input:
    KEYS[1] pending
    KEYS[2] inflight
    KEYS[3] stats
    KEYS[4] delayed
    KEYS[5] wake
    KEYS[6] leases
    KEYS[7] workers
    ARGV[1] prefix
    ARGV[2] owner
    ARGV[3] lease_ms
    ARGV[4] max_count
    ARGV[5] result_ttl_ms
    ARGV[6] max_score ('' = any: a sharded claim takes one priority band)
    ARGV[7] affinity ('' = none, 'prefix' or 'session': includes/affinity.lua)
    ARGV[8] affinity_max_wait_ms

  First promotes retries whose backoff has passed from delayed to pending (original score),
  each checked before it moves. Then reads up to max_count ids from the head of pending and
  checks each request's fields; only then writes: the valid ones move to inflight (score =
  lease deadline) with owner, and a fresh lease token goes into leases; the attempt count is not touched (START
  counts runs). A request whose deadline already passed is answered 'expired' and never
  runs; a damaged one is answered 'corrupt_request'; garbage is dropped and counted. When
  pending is left empty the wake list is cleared, so stale tokens never accumulate.

  Under cache affinity (includes/affinity.lua), the ms until the next delayed retry also
  counts the ms until a request left for another worker becomes due.

  Output: {now, {{id, payload, token, attempt (this run's number), enqueued ms,
  deadline ms or '', reply inbox or '', tenant or '', batch cap (0: none), lost runs,
  the ms admission predicted to its result or 0}, ...}, expired, ms until the next delayed retry is due or -1,
  {corrupt id, reason, ...}, {garbage key, ...}, claimed by affinity preference}
]]
-- @include clock
-- @include request
-- @include stats
-- @include queued
-- @include affinity
local pending, inflight, stats, delayed, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local leases = KEYS[6]
local prefix, owner = ARGV[1], ARGV[2]
local lease, max_n, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local top = ARGV[6]
if top == '' then top = '+inf' end
local now = now_ms()
local corrupt, garbage = {}, {}
-- 1. due retries
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', num(now), 'LIMIT', 0, 1000)
if #due > 0 then
  local checked = check_all(prefix, due)
  local zadd = {}
  for i, id in ipairs(due) do
    local kind, r = checked[i][1], checked[i][2]
    if kind == 'ok' then
      redis.call('HSET', prefix .. K_REQ .. id, F_STATE, STATE_PENDING)
      zadd[#zadd + 1] = r.s
      zadd[#zadd + 1] = id
      queued_move(r.s, r.qt, 1)
    else
      drop_bad(prefix, id, kind, r, now, ttl, corrupt, garbage)
    end
  end
  bulk('ZREM', delayed, due)
  bulk('ZADD', pending, zadd)
end
-- 2. the claim: read and check the window, then write
local mode, max_wait = ARGV[7] or '', tonumber(ARGV[8] or '0') or 0
local ids, preferred, passed, affinity_due = nil, 0, {}, -1
if mode == 'prefix' or mode == 'session' then
  ids, preferred, passed, affinity_due = affinity_pick(prefix, pending, KEYS[7], top, max_n,
                                                       owner, mode, max_wait, now)
else
  ids = redis.call('ZRANGEBYSCORE', pending, '-inf', top, 'LIMIT', 0, max_n)
end
local checked = check_all(prefix, ids)
local out, expired, deadlines, tokens = {}, 0, {}, {}
local deadline, now_s = num(now + lease), num(now)
for i, id in ipairs(ids) do
  local kind, r = checked[i][1], checked[i][2]
  local rkey = prefix .. K_REQ .. id
  if kind == 'ok' then queued_move(r.s, r.qt, -1) end
  if kind == 'ok' and r.dl and r.dl <= now then
    put_result(prefix, id, error_result(id, 'expired', 'deadline_exceeded',
      'the deadline passed while the request was queued', r.a, r.eq, now), ttl, r.rt)
    redis.call('DEL', rkey)
    tenant_done(r.tn)
    expired = expired + 1
  elseif kind == 'ok' then
    local attempt = r.a + 1
    local token = owner .. '/' .. attempt .. '/' .. now_s
    redis.call('HSET', rkey, F_STATE, STATE_INFLIGHT, F_OWNER, owner, F_CLAIMED, now_s)
    deadlines[#deadlines + 1] = deadline
    deadlines[#deadlines + 1] = id
    tokens[#tokens + 1] = id
    tokens[#tokens + 1] = token
    out[#out + 1] = {id, r.p, token, attempt, num(r.eq), r.dl and num(r.dl) or '', r.rt or '',
                     r.tn or '', r.cap or 0, r.lost, r.pw}
  else
    drop_bad(prefix, id, kind, r, now, ttl, corrupt, garbage)
  end
end
for _, id in ipairs(passed) do
  redis.pcall('HSETNX', prefix .. K_REQ .. id, F_SKIPPED, now_s)
end
bulk('ZADD', inflight, deadlines)
bulk('HSET', leases, tokens)
bulk('ZREM', pending, ids)
queued_flush(stats)
flush_inboxes(prefix, ttl)
if expired > 0 then count_done(stats, 'expired', expired, now) end
count_bad(stats, #corrupt / 2, #garbage, now)
tenant_flush(stats)
if redis.call('ZCARD', pending) == 0 then redis.call('DEL', wake) end
local next_due = -1
local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if first[2] then next_due = math.max(tonumber(first[2]) - now, 0) end
if affinity_due >= 0 and (next_due < 0 or affinity_due < next_due) then next_due = affinity_due end
return {num(now), out, expired, next_due, corrupt, garbage, preferred}
