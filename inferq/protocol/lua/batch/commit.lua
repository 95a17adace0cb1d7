--[[
  Commits one step of a batch's lease holder: the part it wrote to the file store (if any),
  the input lines it consumed, the inbox entries it drained and the outcomes it counted.
  Refused unless the caller still holds the lease and the batch is where the caller read it
  (its part count and cursor): a step redone after a crash overwrites the same part and
  commits once.

  Input:
    KEYS[1] batch
    KEYS[2] inbox
    ARGV[1] token
    ARGV[2] parts
    ARGV[3] wrote_part
    ARGV[4] cursor
    ARGV[5] new_cursor
    ARGV[6] new_offset
    ARGV[7] drained
    ARGV[8] invalid
    ARGV[9] completed
    ARGV[10] failed
    ARGV[11] expired

  Output: 'ok', 'lost' (another holder has the lease) or 'stale' (the batch moved on).
]]
local batch, inbox = KEYS[1], KEYS[2]
local h = redis.call('HMGET', batch, B_LEASE_TOKEN, B_PARTS, B_CURSOR)
if h[1] ~= ARGV[1] then return 'lost' end
if (tonumber(h[2]) or 0) ~= tonumber(ARGV[2]) or (tonumber(h[3]) or 0) ~= tonumber(ARGV[4]) then
  return 'stale'
end
if ARGV[3] == '1' then redis.call('HINCRBY', batch, B_PARTS, 1) end
if ARGV[5] ~= ARGV[4] then
  redis.call('HSET', batch, B_CURSOR, ARGV[5], B_OFFSET, ARGV[6])
end
local drained = tonumber(ARGV[7])
if drained > 0 then redis.call('LTRIM', inbox, drained, -1) end
local counters = {B_INVALID, B_COMPLETED, B_FAILED, B_EXPIRED}
for i, field in ipairs(counters) do
  local n = tonumber(ARGV[7 + i])
  if n ~= 0 then redis.call('HINCRBY', batch, field, n) end
end
return 'ok'
