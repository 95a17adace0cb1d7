-- @include checks
-- @include results
-- @include tenants
-- The checked fields of a request hash read as HMGET of READ (h: its reply, or nil for a key
-- of another type). Returns kind, r: kind 'ok' (r: the numbers; r.cap nil without a batch
-- cap, r.lost 0 without lost runs, r.qt nil when it counts no queued tokens), 'garbage' (no payload and
-- no enqueue time: nothing ties it to a request) or 'corrupt' (r.why says what).
local READ = {F_PAYLOAD, F_SCORE, F_ATTEMPTS, F_MAX_ATTEMPTS, F_ENQUEUED, F_DEADLINE,
              F_REPLY_TO, F_TENANT, F_CAP, F_LOST, F_QUEUED, F_PREDICTED}
local function check(h)
  if not h then return 'corrupt', {why = 'the request key is not a hash'} end
  if not h[1] and not h[5] then return 'garbage', {} end
  local r = {p = h[1], rt = h[7] or nil, tn = h[8] or nil}
  r.a = int(h[3], 0, MAX_ATTEMPTS)
  r.eq = int(h[5], 0, MAXI)
  if not h[1] then r.why = 'it has no payload'
  elseif not int(h[2], 0, MAXI) then r.why = 'its score is not an integer'
  elseif not r.a then r.why = 'its attempt count is not an integer >= 0'
  elseif not int(h[4], 1, MAX_ATTEMPTS) then r.why = 'its max attempts is not an integer >= 1'
  elseif r.a >= tonumber(h[4]) then r.why = 'its attempts are already used up'
  elseif not r.eq then r.why = 'its enqueue time is not an integer'
  elseif h[6] and not int(h[6], 0, MAXI) then r.why = 'its deadline is not an integer'
  elseif h[9] and not int(h[9], 1, MAXI) then r.why = 'its batch cap is not an integer >= 1'
  elseif h[10] and not int(h[10], 0, MAXI) then r.why = 'its lost runs are not an integer'
  end
  if r.why then return 'corrupt', r end
  r.s, r.ma, r.dl = h[2], tonumber(h[4]), h[6] and tonumber(h[6]) or nil
  r.cap, r.lost = h[9] and tonumber(h[9]) or nil, tonumber(h[10] or 0)
  r.qt = h[11]  -- its tokens counted while pending (includes/queued.lua), or nil
  r.pw = int(h[12], 0, MAXI) or 0  -- the ms admission predicted (0: none)
  return 'ok', r
end
-- check() of the request hash of every id, read before any write: {kind, r} each
local function check_all(prefix, ids)
  local checked = {}
  for i, id in ipairs(ids) do
    checked[i] = {check(fields(prefix .. K_REQ .. id, unpack(READ)))}
  end
  return checked
end
-- answers a damaged request with a corrupt_request result and deletes its key (the caller
-- then calls tenant_flush)
local function fail_corrupt(prefix, id, r, now, ttl)
  put_result(prefix, id, error_result(id, 'failed', 'corrupt_request',
    'the stored request is damaged: ' .. r.why, r.a, r.eq, now), ttl, r.rt)
  redis.call('DEL', prefix .. K_REQ .. id)
  tenant_done(r.tn)
end
-- a request check() did not pass: a damaged one ('corrupt') is answered (fail_corrupt) and
-- noted in corrupt (id, reason); garbage is deleted and its key noted in garbage
local function drop_bad(prefix, id, kind, r, now, ttl, corrupt, garbage)
  if kind == 'corrupt' then
    fail_corrupt(prefix, id, r, now, ttl)
    corrupt[#corrupt + 1] = id
    corrupt[#corrupt + 1] = r.why
  else
    redis.call('DEL', prefix .. K_REQ .. id)
    garbage[#garbage + 1] = prefix .. K_REQ .. id
  end
end
