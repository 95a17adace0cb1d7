--[[
  Writes the outcome of requests that ran: token-checked, first writer wins.

  Input:
    KEYS[1] inflight
    KEYS[2] stats
    KEYS[3] delayed
    KEYS[4] dead
    KEYS[5] wake
    KEYS[6] started
    KEYS[7] dead_letters
    KEYS[8] leases
    KEYS[9] fair
    ARGV[1] prefix
    ARGV[2] result_ttl_ms
    ARGV[3] dead_letter_cap
    ARGV[4] packed rows of 11: id, token, status, body, retry_delay_ms, attempt, enqueued_ms, reply_to, tenant, prompt_tokens, completion_tokens

  A zombie (a worker whose lease was taken over) or a request cancelled meanwhile gets its
  write refused. Status 'retry' puts the request in the delayed set for the given backoff,
  its finished run counted in its attempts (claim promotes it when due); 'dead' writes the
  body as the final result and dead-letters the id; any other status is final and deletes
  the request hash (one DEL for all of them). A retry also pushes a wake token, so an idle worker learns when the
  retry falls due. Stats, inboxes and sets are written once per call. Each final result
  counts its tenant's billable usage (a request and its prompt and completion tokens) in the
  shard's hourly usage hash, once per call per tenant (``includes/usage``). A final result of a
  tenant's request that used fewer tokens (prompt + completion) than its enqueue charged its
  fair-share clock gives the rest back to that clock (``includes/refund``: one HGET of the
  request's charge, then one HSET of the fair hash for the call).

  The tokens are checked in leases, one HMGET for the call; the rest of a row (this run's
  attempt, the enqueue time, reply inbox and tenant) is what the claim returned, trusted
  because the token matched (none of them changes while a lease lasts), so nothing else is
  read per request.

  Output: 1 (done) or 0 (refused) per request.
]]
-- @include clock
-- @include rows
-- @include request
-- @include flight
-- @include graves
-- @include stats
-- @include tenants
-- @include usage
-- @include refund
-- @include wake
local inflight, stats, delayed, dead, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local started, records, leases, fair = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local prefix, ttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local W = 11
local a = rows(ARGV[4], W)
if not a then return redis.error_reply('ERR inferq complete: bad arguments') end
local now = now_ms()
-- check every row, then read every token (one HMGET per CHUNK ids)
local ids = {}
for i = 1, #a, W do
  if not (strings(a[i], a[i + 1]) and strings(a[i + 2], a[i + 3])
          and int(a[i + 4], 0, MAXI) and int(a[i + 5], 1, MAX_ATTEMPTS)
          and int(a[i + 6], 0, MAXI) and strings(a[i + 7], a[i + 8])
          and int(a[i + 9], 0, MAXI) and int(a[i + 10], 0, MAXI)) then
    return redis.error_reply('ERR inferq complete: bad arguments')
  end
  ids[#ids + 1] = a[i]
end
local tokens = tokens_of(leases, ids)
-- write
local out, refused, counts, done, retry, gone = {}, 0, {}, {}, {}, {}
for n, id in ipairs(ids) do
  local i = 1 + (n - 1) * W
  local status, rt, tn = a[i + 2], a[i + 7], a[i + 8]
  local rkey = prefix .. K_REQ .. id
  if tokens[n] ~= a[i + 1] then
    refused = refused + 1
    out[n] = 0
  elseif status == 'retry' then
    redis.call('HSET', rkey, F_STATE, STATE_DELAYED, F_ATTEMPTS, a[i + 5])
    redis.call('HDEL', rkey, F_OWNER)
    retry[#retry + 1] = num(now + a[i + 4])
    retry[#retry + 1] = id
    done[#done + 1] = id
    out[n] = 1
  else
    put_result(prefix, id, a[i + 3], ttl, rt)
    if status == 'dead' then
      local code, message, attempts = result_error(a[i + 3])
      bury(rkey, id, code, message, attempts, now)
    end
    gone[#gone + 1] = rkey
    tenant_done(tn)
    usage_add(tn, a[i + 9], a[i + 10])
    fair_refund(fair, rkey, tn, a[i + 9] + a[i + 10])
    counts[status] = (counts[status] or 0) + 1
    done[#done + 1] = id
    out[n] = 1
  end
end
for i = 1, #gone, CHUNK do redis.call('DEL', unpack(gone, i, math.min(i + CHUNK - 1, #gone))) end
land(inflight, started, leases, done)
flush_inboxes(prefix, ttl)
dead_letter(dead, records, stats, cap)
for status, c in pairs(counts) do count_done(stats, status, c, now) end
tenant_flush(stats)
usage_flush(prefix, now)
refund_save(fair)
if refused > 0 then redis.call('HINCRBY', stats, 'refused', refused) end
if #retry > 0 then
  bulk('ZADD', delayed, retry)
  redis.call('HINCRBY', stats, 'retried', #retry / 2)
  wake_workers(wake, 1)
end
return out
