--[[
  Extends every lease whose token still matches and marks the worker alive: in the registry
  (workers), and, unless a sweep already did, as seen connected to this run of the server in
  conns (the beat came over one of its named connections: from now on a death is noticed by
  its closed connections, see reclaim.lua; INFO is read only then).

  Input:
    KEYS[1] inflight
    KEYS[2] workers
    KEYS[3] leases
    KEYS[4] conns
    ARGV[1] prefix
    ARGV[2] worker_id
    ARGV[3] lease_ms
    ARGV[4] liveness_ms
    ARGV[5] packed rows of 2: id, token

  Output: the ids whose lease was lost (reclaimed or finished elsewhere).
]]
-- @include clock
-- @include rows
-- @include bulk
-- @include flight
local inflight, workers = KEYS[1], KEYS[2]
local prefix, worker = ARGV[1], ARGV[2]
local lease, liveness = tonumber(ARGV[3]), tonumber(ARGV[4])
local a = rows(ARGV[5], 2)
if not a then return redis.error_reply('ERR inferq heartbeat: bad arguments') end
local now = now_ms()
local lost, renew = {}, {}
local deadline = num(now + lease)
local ids, held = leased(KEYS[3], a)
if not ids then return redis.error_reply('ERR inferq heartbeat: bad arguments') end
for n, id in ipairs(ids) do
  if held[n] then
    renew[#renew + 1] = deadline
    renew[#renew + 1] = id
  else
    lost[#lost + 1] = id
  end
end
local mark = redis.call('HGET', KEYS[4], worker)
redis.call('ZADD', workers, num(now + liveness), worker)
if not mark or string.sub(mark, 1, 3) ~= 'up ' then
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '?'
  redis.call('HSET', KEYS[4], worker, 'up ' .. run)
end
redis.call('ZREMRANGEBYSCORE', workers, '-inf', num(now - 60000))
bulk('ZADD', inflight, renew, 'XX')
return lost
