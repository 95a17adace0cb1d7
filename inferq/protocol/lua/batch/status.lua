--[[
  Moves a batch from one of the given statuses to a new one, stamps the time of the move in
  the given field (Redis clock, unix seconds) and sets other fields, in one step.

  Input:
    KEYS[1] batch
    ARGV[1] token
    ARGV[2] from
    ARGV[3] status
    ARGV[4] stamp
    ARGV[5..] rows of 2: field, value

  token: '' lets any caller move it (a cancel), else only the lease holder. from: the allowed
  current statuses, space separated. stamp: the field to set to now, or ''.

  Output: {'ok', previous status}, {'refused', current status}, {'lost', status} (not the
  lease holder) or {'gone', ''} (no such batch).
]]
local batch = KEYS[1]
local token, from, status, stamp = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local h = redis.call('HMGET', batch, B_STATUS, B_LEASE_TOKEN)
if not h[1] then return {'gone', ''} end
if token ~= '' and h[2] ~= token then return {'lost', h[1]} end
local allowed = false
for s in string.gmatch(from, '%S+') do
  if s == h[1] then allowed = true end
end
if not allowed then return {'refused', h[1]} end
redis.call('HSET', batch, B_STATUS, status)
if stamp ~= '' then
  local t = redis.call('TIME')
  redis.call('HSET', batch, stamp, t[1])
end
for i = 5, #ARGV, 2 do
  redis.call('HSET', batch, ARGV[i], ARGV[i + 1])
end
return {'ok', h[1]}
