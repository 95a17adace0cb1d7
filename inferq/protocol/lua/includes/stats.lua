-- @include clock
-- @include checks
-- Counters of the queue's stats hash, and its ring of per-second completion counts (64
-- slots: ts:<slot> the second, n:<slot> its count), read by ``inferq stats``.
local function count_done(stats, status, n, now)
  redis.call('HINCRBY', stats, status, n)
  local sec = math.floor(now / 1000)
  local slot = sec % 64
  if redis.call('HGET', stats, 'ts:' .. slot) ~= num(sec) then
    redis.call('HSET', stats, 'ts:' .. slot, num(sec), 'n:' .. slot, 0)
  end
  redis.call('HINCRBY', stats, 'n:' .. slot, n)
end
-- counts requests answered corrupt_request and garbage keys dropped
local function count_bad(stats, corrupt, garbage, now)
  if corrupt > 0 then
    count_done(stats, 'failed', corrupt, now)
    redis.call('HINCRBY', stats, 'corrupt', corrupt)
  end
  if garbage > 0 then redis.call('HINCRBY', stats, 'garbage', garbage) end
end
