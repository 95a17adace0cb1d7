-- one wake token per new request for idle workers (BLPOP), the list capped at 64
local function wake_workers(wake, n)
  n = math.min(n, 64 - redis.call('LLEN', wake))
  if n > 0 then
    local tokens = {}
    for i = 1, n do tokens[i] = '1' end
    redis.call('RPUSH', wake, unpack(tokens))
  end
end
