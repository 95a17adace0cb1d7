--[[
  Read-only head of one shard: a worker of a sharded queue peeks at every shard before a
  claim round, to claim only the best priority present.

  Input:
    KEYS[1] pending
    KEYS[2] delayed

  Output: {lowest pending score or '', ms until the next delayed retry is due or -1}
]]
-- @include clock
local now = now_ms()
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local due = -1
if first[2] then due = math.max(tonumber(first[2]) - now, 0) end
return {head[2] or '', due}
