-- @include bulk
-- Requests leaving flight: their leases (inflight) and their marks as started go.
local function land(inflight, started, ids)
  bulk('ZREM', inflight, ids)
  bulk('SREM', started, ids)
end
