--[[
  Withdraws a batch's lines that still wait in the queue (pending, or delayed for a retry);
  running ones are left to finish. For a cancel they are gone, counted in the batch's
  withdrawn field in the same step; for an expiry each gets an 'expired' result, pushed to
  the batch's inbox like any other result, where the holder counts it. An id that is no
  longer waiting (running, finished, never queued) is left alone: the pass can be redone.

  Input:
    KEYS[1] pending
    KEYS[2] delayed
    KEYS[3] batch
    KEYS[4] stats (of the queue shard)
    ARGV[1] prefix
    ARGV[2] token
    ARGV[3] mode
    ARGV[4] reply_to
    ARGV[5] result_ttl_ms
    ARGV[6..] rows of 1: id

  mode: 'cancel' or 'expire'. Output: how many were withdrawn, or -1 when the caller does not
  hold the batch's lease.
]]
-- @include clock
-- @include checks
-- @include results
-- @include queued
local pending, delayed, batch = KEYS[1], KEYS[2], KEYS[3]
local prefix, token, mode, rt = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl = tonumber(ARGV[5])
if redis.call('HGET', batch, B_LEASE_TOKEN) ~= token then return -1 end
local now = now_ms()
local n = 0
for i = 6, #ARGV do
  local id = ARGV[i]
  local rkey = prefix .. K_REQ .. id
  local h = fields(rkey, F_STATE, F_ATTEMPTS, F_ENQUEUED, F_SCORE, F_QUEUED)
  if h and (h[1] == STATE_PENDING or h[1] == STATE_DELAYED) then
    if redis.call('ZREM', pending, id) == 1 then queued_move(h[4], h[5], -1) end
    redis.call('ZREM', delayed, id)
    redis.call('DEL', rkey)
    if mode == 'expire' then
      put_result(prefix, id, error_result(id, 'expired', 'deadline_exceeded',
        'the batch expired before this line ran', int(h[2], 0, MAX_ATTEMPTS),
        int(h[3], 0, MAXI), now), ttl, rt)
    end
    n = n + 1
  end
end
queued_flush(KEYS[4])
if mode == 'expire' then
  flush_inboxes(prefix, ttl)
elseif n > 0 then
  redis.call('HINCRBY', batch, B_WITHDRAWN, n)
end
return n
