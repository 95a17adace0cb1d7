-- @include bulk
-- @include rows
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
-- Rows of (id, token), as start, heartbeat and release take them: the ids, and whether each
-- token is the id's current lease (held[n]); nil when a row is not two strings.
local function leased(leases, a)
  local ids = {}
  for i = 1, #a, 2 do
    if not strings(a[i], a[i + 1]) then return nil end
    ids[#ids + 1] = a[i]
  end
  local tokens, held = tokens_of(leases, ids), {}
  for n = 1, #ids do held[n] = tokens[n] == a[2 * n] end
  return ids, held
end
