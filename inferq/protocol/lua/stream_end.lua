--[[
  After a generating worker's complete call: appends the end marker to the stream of each id
  whose result exists, so readers blocked in XREAD stop waiting.

  Input:
    KEYS[1] inflight (names the queue's slot)
    ARGV[1] prefix
    ARGV[2] result_ttl_ms
    ARGV[3..] rows of 1: id

  Output: how many markers were appended.
]]
-- @include force
local prefix, ttl = ARGV[1], tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('EXISTS', prefix .. K_RESULT .. id) == 1 then
    local skey = prefix .. K_STREAM .. id
    force('XADD', skey, '*', SF_END, 1)
    redis.call('PEXPIRE', skey, ttl)
    n = n + 1
  end
end
return n
