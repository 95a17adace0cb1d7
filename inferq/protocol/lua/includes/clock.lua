-- Time from Redis TIME (one clock for every producer and worker), and numbers as text.
-- Numbers are formatted with %.0f: redis.call would otherwise render a Lua double with
-- %.14g and lose digits of large scores.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function num(x) return string.format('%.0f', x) end
