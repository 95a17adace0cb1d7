--[[
  Marks claims as running, right before the model runs them: each one whose lease token
  still matches is added to started (its run now counts as an attempt if its lease is lost).

  Input:
    KEYS[1] started
    ARGV[1] prefix
    ARGV[2] packed rows of 2: id, token

  Output: the ids whose lease was lost (reclaimed, cancelled): the worker must not run them.
]]
-- @include rows
-- @include bulk
local prefix, a = ARGV[1], rows(ARGV[2], 2)
if not a then return redis.error_reply('ERR inferq start: bad arguments') end
local ok, lost = {}, {}
for i = 1, #a, 2 do
  local id, token = a[i], a[i + 1]
  if not strings(id, token) then return redis.error_reply('ERR inferq start: bad arguments') end
  local t = redis.pcall('HGET', prefix .. K_REQ .. id, F_TOKEN)
  if t == token then ok[#ok + 1] = id else lost[#lost + 1] = id end
end
bulk('SADD', KEYS[1], ok)
return lost
