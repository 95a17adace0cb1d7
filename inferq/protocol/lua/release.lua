--[[
  Gives claims that did not run back to pending at once (clean shutdown, a displaced window,
  a generation that never reached the model), with their original score and no attempt
  counted (a START is undone). A claim whose score is no longer readable is left to expire:
  RECLAIM answers it.

  Input:
    KEYS[1] inflight
    KEYS[2] pending
    KEYS[3] wake
    KEYS[4] started
    KEYS[5] leases
    KEYS[6] stats
    ARGV[1] prefix
    ARGV[2] packed rows of 2: id, token

  Output: how many were released.
]]
-- @include checks
-- @include rows
-- @include flight
-- @include wake
-- @include queued
local inflight, pending, wake, started, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, a = ARGV[1], rows(ARGV[2], 2)
if not a then return redis.error_reply('ERR inferq release: bad arguments') end
local asked, held = leased(leases, a)
if not asked then return redis.error_reply('ERR inferq release: bad arguments') end
local back = {}
for n, id in ipairs(asked) do
  if held[n] then
    local h = fields(prefix .. K_REQ .. id, F_SCORE, F_QUEUED)
    if h and int(h[1], 0, MAXI) then back[#back + 1] = {id, h[1], h[2]} end
  end
end
local ids, zadd = {}, {}
for _, b in ipairs(back) do
  local rkey = prefix .. K_REQ .. b[1]
  redis.call('HSET', rkey, F_STATE, STATE_PENDING)
  redis.call('HDEL', rkey, F_OWNER)
  ids[#ids + 1] = b[1]
  zadd[#zadd + 1] = b[2]
  zadd[#zadd + 1] = b[1]
  queued_move(b[2], b[3], 1)
end
land(inflight, started, leases, ids)
bulk('ZADD', pending, zadd)
queued_flush(KEYS[6])
if #ids > 0 then wake_workers(wake, #ids) end
return #ids
