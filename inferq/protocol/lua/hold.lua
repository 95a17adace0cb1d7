--[[
  Publishes the identities (prefix hashes, sessions: inferq/protocol/prefix.py) a worker's
  engine holds in its prefix cache (and 'saturated' while the worker is: others' claims then
  stop leaving its requests to it): replaces the worker's held set with them and sets its
  TTL, so that a worker that stops refreshing it (dead) leaves nothing behind.

  Input:
    KEYS[1] stats
    ARGV[1] prefix
    ARGV[2] owner
    ARGV[3] ttl_ms (0: delete the set)
    ARGV[4..] rows of 1: identity

  Output: the number of identities published.
]]
-- @include bulk
local prefix, owner, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local held = prefix .. K_HELD .. owner
if not ttl or ttl < 0 or #ARGV - 3 > AFFINITY_MAX_HELD + 1 then
  return redis.error_reply('ERR inferq hold: bad arguments')
end
for i = 4, #ARGV do
  if ARGV[i] ~= AFFINITY_SATURATED
     and not string.find(ARGV[i], '^' .. string.rep('%x', AFFINITY_HEX) .. '$') then
    return redis.error_reply('ERR inferq hold: bad identity')
  end
end
redis.call('DEL', held)
if ttl == 0 or #ARGV == 3 then return 0 end
for i = 4, #ARGV, CHUNK do
  redis.call('SADD', held, unpack(ARGV, i, math.min(i + CHUNK - 1, #ARGV)))
end
redis.call('PEXPIRE', held, ttl)
return #ARGV - 3
