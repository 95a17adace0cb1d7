--[[
  Cancels a queued, delayed or running request: writes a 'cancelled' result (which also
  refuses a later completion of a running one). A running request's id is pushed onto its
  owner's cancel list (expiring with CANCEL_NOTICE_TTL_MS, so a dead owner's list goes away):
  a generate worker blocks on it and frees the slot at its next decode step.

  Input:
    KEYS[1] pending
    KEYS[2] inflight
    KEYS[3] stats
    KEYS[4] delayed
    KEYS[5] started
    KEYS[6] leases
    ARGV[1] prefix
    ARGV[2] id
    ARGV[3] result_ttl_ms

  Output: 'cancelled', 'done' (already finished) or 'unknown'.
]]
-- @include clock
-- @include checks
-- @include results
-- @include stats
-- @include tenants
-- @include queued
local pending, inflight, stats, delayed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local started = KEYS[5]
local prefix, id, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local CANCEL_NOTICE_TTL_MS = 60000
local rkey = prefix .. K_REQ .. id
if redis.call('EXISTS', rkey) == 0 then
  if redis.call('EXISTS', prefix .. K_RESULT .. id) == 1 then return 'done' end
  return 'unknown'
end
local h = fields(rkey, F_ATTEMPTS, F_ENQUEUED, F_OWNER, F_REPLY_TO, F_TENANT, F_SCORE,
                 F_QUEUED) or {}
local owner = type(h[3]) == 'string' and h[3] or nil
local now = now_ms()
if redis.call('ZREM', pending, id) == 1 then queued_move(h[6], h[7], -1) end
if redis.call('ZREM', inflight, id) == 1 and owner then
  local notice = prefix .. K_CANCELS .. owner
  force('RPUSH', notice, id)
  redis.call('PEXPIRE', notice, CANCEL_NOTICE_TTL_MS)
end
redis.call('ZREM', delayed, id)
redis.call('SREM', started, id)
redis.call('HDEL', KEYS[6], id)
put_result(prefix, id, error_result(id, 'cancelled', 'cancelled', 'cancelled by the producer',
  int(h[1], 0, MAX_ATTEMPTS), int(h[2], 0, MAXI), now), ttl, h[4] or nil)
redis.call('DEL', rkey)
tenant_done(h[5])
tenant_flush(stats)
queued_flush(stats)
flush_inboxes(prefix, ttl)
count_done(stats, 'cancelled', 1, now)
return 'cancelled'
