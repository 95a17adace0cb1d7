-- a write to a per-request key that may have been overwritten by hand with another type:
-- the damaged key is replaced
local function force(cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    redis.call('DEL', key)
    redis.call(cmd, key, ...)
  end
end
