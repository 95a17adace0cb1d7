-- @include bulk
-- Requests leaving flight: their leases (inflight, and their tokens in leases) and their
-- marks as started go.
local function land(inflight, started, leases, ids)
  bulk('ZREM', inflight, ids)
  bulk('SREM', started, ids)
  bulk('HDEL', leases, ids)
end
-- The lease token of each id (HMGET of leases, CHUNK ids a command), false where none.
local function tokens_of(leases, ids)
  local out = {}
  for i = 1, #ids, CHUNK do
    local got = redis.call('HMGET', leases, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
    for j = 1, #got do out[i + j - 1] = got[j] end
  end
  return out
end
