-- @include bulk
-- Requests leaving flight: their leases (inflight) and their marks as started go.
local function land(inflight, started, ids)
  bulk('ZREM', inflight, ids)
  bulk('SREM', started, ids)
end
-- Dead letters (entries: score, id, ...): the set is capped at its newest cap.
local function dead_letter(dead, entries, cap)
  if #entries > 0 then
    bulk('ZADD', dead, entries)
    redis.call('ZREMRANGEBYRANK', dead, 0, -(cap + 1))
  end
end
