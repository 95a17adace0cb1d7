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
    ARGV[1] prefix
    ARGV[2] result_ttl_ms
    ARGV[3] dead_letter_cap
    ARGV[4] packed rows of 5: id, token, status, body, retry_delay_ms

  A zombie (a worker whose lease was taken over) or a request cancelled meanwhile gets its
  write refused. Status 'retry' puts the request in the delayed set for the given backoff,
  its finished run counted in its attempts (claim promotes it when due); 'dead' writes the
  body as the final result and dead-letters the id; any other status is final and deletes
  the request hash (one DEL for all of them). A retry also pushes a wake token, so an idle worker learns when the
  retry falls due. Stats, inboxes and sets are written once per call.

  Output: 1 (done) or 0 (refused) per request.
]]
-- @include clock
-- @include rows
-- @include request
-- @include flight
-- @include graves
-- @include stats
-- @include tenants
-- @include wake
local inflight, stats, delayed, dead, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local started, records = KEYS[6], KEYS[7]
local prefix, ttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local a = rows(ARGV[4], 5)
if not a then return redis.error_reply('ERR inferq complete: bad arguments') end
local now = now_ms()
-- read and check
local reads = {}
for i = 1, #a, 5 do
  if not (strings(a[i], a[i + 1]) and strings(a[i + 2], a[i + 3])) then
    return redis.error_reply('ERR inferq complete: bad arguments')
  end
  local h = fields(prefix .. K_REQ .. a[i], F_TOKEN, F_REPLY_TO, F_ATTEMPTS, F_ENQUEUED,
                   F_TENANT)
  local ok = h ~= nil and h[1] == a[i + 1]
  reads[#reads + 1] = {ok = ok, rt = ok and h[2] or nil, a = ok and int(h[3], 0, MAX_ATTEMPTS),
                       tn = ok and h[5] or nil,
                       eq = ok and int(h[4], 0, MAXI) or nil,
                       delay = int(a[i + 4], 0, MAXI)}
end
-- write
local out, refused, counts, done, retry, corrupt, gone = {}, 0, {}, {}, {}, {}, {}
for n, r in ipairs(reads) do
  local i = 1 + (n - 1) * 5
  local id, status = a[i], a[i + 2]
  local rkey = prefix .. K_REQ .. id
  if not r.ok then
    refused = refused + 1
    out[n] = 0
  elseif status == 'retry' and r.a and r.delay then
    redis.call('HSET', rkey, F_STATE, STATE_DELAYED, F_ATTEMPTS, r.a + 1)
    redis.call('HDEL', rkey, F_OWNER, F_TOKEN)
    retry[#retry + 1] = num(now + r.delay)
    retry[#retry + 1] = id
    done[#done + 1] = id
    out[n] = 1
  elseif status == 'retry' then
    fail_corrupt(prefix, id, {why = 'its attempt count is not an integer >= 0', a = r.a,
      eq = r.eq, rt = r.rt, tn = r.tn}, now, ttl)
    corrupt[#corrupt + 1] = id
    done[#done + 1] = id
    out[n] = 1
  else
    put_result(prefix, id, a[i + 3], ttl, r.rt)
    if status == 'dead' then
      local code, message, attempts = result_error(a[i + 3])
      bury(rkey, id, code, message, attempts, now)
    end
    gone[#gone + 1] = rkey
    tenant_done(r.tn)
    counts[status] = (counts[status] or 0) + 1
    done[#done + 1] = id
    out[n] = 1
  end
end
for i = 1, #gone, CHUNK do redis.call('DEL', unpack(gone, i, math.min(i + CHUNK - 1, #gone))) end
land(inflight, started, done)
flush_inboxes(prefix, ttl)
dead_letter(dead, records, stats, cap)
for status, c in pairs(counts) do count_done(stats, status, c, now) end
count_bad(stats, #corrupt, 0, now)
tenant_flush(stats)
if refused > 0 then redis.call('HINCRBY', stats, 'refused', refused) end
if #retry > 0 then
  bulk('ZADD', delayed, retry)
  redis.call('HINCRBY', stats, 'retried', #retry / 2)
  wake_workers(wake, 1)
end
return out
