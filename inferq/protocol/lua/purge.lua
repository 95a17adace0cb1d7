--[[
  Purges dead letters: their ids leave the dead set and their records go. Their dead-letter
  results stay until their TTL (a producer may still read them). Idempotent; counted in the
  stats (dead_purged).

  Input:
    KEYS[1] dead
    KEYS[2] dead_letters
    KEYS[3] stats
    ARGV[1] prefix
    ARGV[2..] rows of 1: id

  Output: per id: 'purged', or 'absent' (not in the dead set: never there, or already
  requeued or purged).
]]
-- @include bulk
local dead, records, stats = KEYS[1], KEYS[2], KEYS[3]
local out, ids = {}, {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', dead, ARGV[i]) then
    redis.call('ZREM', dead, ARGV[i])
    ids[#ids + 1] = ARGV[i]
    out[#out + 1] = 'purged'
  else
    out[#out + 1] = 'absent'
  end
end
bulk('HDEL', records, ids)
if #ids > 0 then redis.call('HINCRBY', stats, 'dead_purged', #ids) end
return out
