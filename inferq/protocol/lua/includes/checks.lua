-- Reading values before the first write: a script that raises keeps what it wrote before.
local MAXI = 9007199254740991
local MAX_ATTEMPTS = 1000
-- x as an integer in [lo, hi], or nil: missing, not a number, fractional, NaN, huge
local function int(x, lo, hi)
  if x == nil or x == false then return nil end
  local n = tonumber(x)
  if n == nil or n ~= n or n ~= math.floor(n) or n < (lo or -MAXI) or n > (hi or MAXI) then
    return nil
  end
  return n
end
-- HMGET that never raises: nil when the key holds another type than a hash
local function fields(key, ...)
  local r = redis.pcall('HMGET', key, ...)
  if r.err then return nil end
  return r
end
