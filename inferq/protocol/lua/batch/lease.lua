--[[
  Takes or renews a batch's lease: taken when free or lapsed, renewed when already ours.
  Every other batch script checks the token, so a holder whose lease was taken over can no
  longer change the batch.

  Input:
    KEYS[1] batch
    ARGV[1] token
    ARGV[2] lease_ms

  Output: {1, status} held (taken or renewed), {0, status} held by another, {-1, ''} no batch.
]]
-- @include clock
local batch = KEYS[1]
local token, lease_ms = ARGV[1], tonumber(ARGV[2])
local h = redis.call('HMGET', batch, B_STATUS, B_LEASE_TOKEN, B_LEASE_UNTIL)
if not h[1] then return {-1, ''} end
local now = now_ms()
if h[2] and h[2] ~= token and (tonumber(h[3]) or 0) > now then return {0, h[1]} end
redis.call('HSET', batch, B_LEASE_TOKEN, token, B_LEASE_UNTIL, num(now + lease_ms))
return {1, h[1]}
