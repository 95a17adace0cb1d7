--[[
  Requeues dead letters. Each goes back to pending under its id with its original score (so
  its priority and its place in arrival order) and every field of its hash as it died (a
  tenant among them), except its lease (owner, token, claim time), its deadline (long passed,
  as a rule) and its reply inbox (its producer already had the dead result; a new wait reads
  the result key). Its attempts start again at 0 (its lost runs, crashes, batch cap and fair
  charge are dropped too: a requeued request gives nothing back to its tenant's clock) and
  its enqueue time is now. Its dead-letter result and stream are deleted (enqueue refuses an
  id whose result exists). Idempotent: an id no longer in the dead set is not queued again.
  Counted in the stats (dead_requeued).

  Input:
    KEYS[1] dead
    KEYS[2] dead_letters
    KEYS[3] pending
    KEYS[4] wake
    KEYS[5] stats
    ARGV[1] prefix
    ARGV[2..] rows of 1: id

  Output: per id: 'requeued'; 'absent' (not in the dead set: never there, or already
  requeued or purged); 'live' (a request with this id waits or runs again: it stays
  dead-lettered); 'no_record' (dead-lettered without a usable record, by an older inferq:
  purge it).
]]
-- @include clock
-- @include checks
-- @include bulk
-- @include wake
-- @include queued
local dead, records, pending, wake, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix = ARGV[1]
local now = now_ms()
local DROP = {[F_OWNER] = true, [F_CLAIMED] = true, [F_DEADLINE] = true,
              [F_REPLY_TO] = true, [F_STATE] = true, [F_ATTEMPTS] = true, [F_ENQUEUED] = true,
              [F_LOST] = true, [F_CRASHES] = true, [F_CAP] = true, [F_CHARGE] = true}
-- read and check every id before the first write
local out, todo, seen = {}, {}, {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local outcome = 'no_record'
  if seen[id] or not redis.call('ZSCORE', dead, id) then
    outcome = 'absent'
  elseif redis.call('EXISTS', prefix .. K_REQ .. id) == 1 then
    outcome = 'live'
  else
    local raw = redis.call('HGET', records, id)
    local ok, rec = false, nil
    if raw then ok, rec = pcall(cmsgpack.unpack, raw) end
    if ok and type(rec) == 'table' and type(rec.h) == 'table' then
      local h, kept = {}, {}
      for k = 1, #rec.h - 1, 2 do
        local name, value = rec.h[k], rec.h[k + 1]
        h[name] = value
        if not DROP[name] then
          kept[#kept + 1] = name
          kept[#kept + 1] = value
        end
      end
      if type(h[F_PAYLOAD]) == 'string' and int(h[F_SCORE], 0, MAXI)
          and int(h[F_MAX_ATTEMPTS], 1, MAX_ATTEMPTS) then
        outcome = 'requeued'
        kept[#kept + 1] = F_STATE
        kept[#kept + 1] = STATE_PENDING
        kept[#kept + 1] = F_ATTEMPTS
        kept[#kept + 1] = 0
        kept[#kept + 1] = F_ENQUEUED
        kept[#kept + 1] = num(now)
        todo[#todo + 1] = {id = id, score = h[F_SCORE], hash = kept, qt = h[F_QUEUED],
                           tn = type(h[F_TENANT]) == 'string' and h[F_TENANT] or nil}
      end
    end
  end
  seen[id] = true
  out[#out + 1] = outcome
end
-- write
if #todo > 0 then
  local zadd, ids, owned = {}, {}, {}
  for _, t in ipairs(todo) do
    if t.tn and t.tn ~= '' then owned[t.tn] = (owned[t.tn] or 0) + 1 end
    redis.call('DEL', prefix .. K_RESULT .. t.id, prefix .. K_STREAM .. t.id)
    redis.call('HSET', prefix .. K_REQ .. t.id, unpack(t.hash))
    zadd[#zadd + 1] = t.score
    zadd[#zadd + 1] = t.id
    queued_move(t.score, t.qt, 1)
    ids[#ids + 1] = t.id
  end
  bulk('ZADD', pending, zadd)
  queued_flush(stats)
  bulk('ZREM', dead, ids)
  bulk('HDEL', records, ids)
  redis.call('HINCRBY', stats, 'dead_requeued', #todo)
  -- unfinished again: counted for its tenant (includes/tenants.lua)
  for tn, c in pairs(owned) do redis.call('HINCRBY', stats, TENANT_COUNT .. tn, c) end
  wake_workers(wake, #todo)
end
return out
