--[[
  Marks claims as running, right before the model runs them: each one whose lease token
  still matches is added to started (its run now counts as an attempt if its lease is lost).

  Input:
    KEYS[1] started
    KEYS[2] leases
    ARGV[1] prefix
    ARGV[2] packed rows of 2: id, token

  Output: the ids whose lease was lost (reclaimed, cancelled): the worker must not run them.
]]
-- @include rows
-- @include bulk
-- @include flight
local prefix, a = ARGV[1], rows(ARGV[2], 2)
if not a then return redis.error_reply('ERR inferq start: bad arguments') end
local ids, held = leased(KEYS[2], a)
if not ids then return redis.error_reply('ERR inferq start: bad arguments') end
local ok, lost = {}, {}
for n, id in ipairs(ids) do
  if held[n] then ok[#ok + 1] = id else lost[#lost + 1] = id end
end
bulk('SADD', KEYS[1], ok)
return lost
