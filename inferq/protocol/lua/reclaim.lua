--[[
  Expired leases of any worker. A request that never started (not in started) goes back to
  pending with its original score and its attempts unchanged. One that started has used an
  attempt: at its max attempts it is dead-lettered (capped set, 'max_attempts' error
  result), else it goes back to pending with the attempt counted (so it runs alone next
  time). Damaged requests are answered 'corrupt_request'; garbage (an inflight member without
  its hash) is dropped.

  Input:
    KEYS[1] inflight
    KEYS[2] pending
    KEYS[3] dead
    KEYS[4] wake
    KEYS[5] stats
    KEYS[6] started
    KEYS[7] dead_letters
    KEYS[8] leases
    ARGV[1] prefix
    ARGV[2] max_count
    ARGV[3] result_ttl_ms
    ARGV[4] dead_letter_cap

  Output: {requeued, dead, {corrupt id, reason, ...}, {garbage key, ...}, requeued unstarted}
]]
-- @include clock
-- @include request
-- @include flight
-- @include graves
-- @include stats
-- @include wake
local inflight, pending, dead, wake, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local started, records, leases = KEYS[6], KEYS[7], KEYS[8]
local prefix, max_n = ARGV[1], tonumber(ARGV[2])
local ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', inflight, '-inf', num(now), 'LIMIT', 0, max_n)
local read = {unpack(READ)}
read[#READ + 1] = F_OWNER
local checked = {}
for i, id in ipairs(ids) do
  local h = fields(prefix .. K_REQ .. id, unpack(read))
  local kind, r = check(h)
  r.ran = redis.call('SISMEMBER', started, id) == 1
  r.owner = h and h[#READ + 1] or nil
  checked[i] = {kind, r}
end
local requeue, corrupt, garbage = {}, {}, {}
local died, unstarted = 0, 0
for i, id in ipairs(ids) do
  local kind, r = checked[i][1], checked[i][2]
  local rkey = prefix .. K_REQ .. id
  if kind == 'ok' then
    local used = r.a + (r.ran and 1 or 0)
    if used >= r.ma then
      local message = 'lease expired on all ' .. used .. ' attempts (last owner '
        .. (r.owner or '?') .. ')'
      put_result(prefix, id, error_result(id, 'dead', 'max_attempts', message, used, r.eq, now),
        ttl, r.rt)
      bury(rkey, id, 'max_attempts', message, used, now)
      redis.call('DEL', rkey)
      tenant_done(r.tn)
      died = died + 1
    else
      redis.call('HSET', rkey, F_STATE, STATE_PENDING, F_ATTEMPTS, used)
      redis.call('HDEL', rkey, F_OWNER)
      requeue[#requeue + 1] = r.s
      requeue[#requeue + 1] = id
      if not r.ran then unstarted = unstarted + 1 end
    end
  else
    drop_bad(prefix, id, kind, r, now, ttl, corrupt, garbage)
  end
end
land(inflight, started, leases, ids)
bulk('ZADD', pending, requeue)
flush_inboxes(prefix, ttl)
dead_letter(dead, records, stats, cap)
if died > 0 then count_done(stats, 'dead', died, now) end
if #requeue > 0 then
  redis.call('HINCRBY', stats, 'reclaimed', #requeue / 2)
  wake_workers(wake, #requeue / 2)
end
count_bad(stats, #corrupt / 2, #garbage, now)
tenant_flush(stats)
return {#requeue / 2, died, corrupt, garbage, unstarted}
