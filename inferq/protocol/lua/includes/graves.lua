-- @include clock
-- @include bulk
-- Dead letters. The set ``dead`` (id -> when it died, ms) is capped at its newest ``cap``;
-- the hash ``dead_letters`` keeps, per id, a msgpack record of the request as it died (its
-- hash's fields, the payload among them; the error code and message; the attempts used), so
-- a dead letter can be shown and requeued. Records leave with their id: when it falls off
-- the cap (counted: dead_dropped), is purged or is requeued. The cap last applied is kept in
-- the stats hash (dead_cap), so operators can see it.
local grave_ids, grave_records = {}, {}
-- notes the request at rkey (read before it is deleted) as dead: call before the DEL
local function bury(rkey, id, code, message, attempts, now)
  local h = redis.pcall('HGETALL', rkey)
  if type(h) ~= 'table' or h.err then h = {} end
  grave_ids[#grave_ids + 1] = num(now)
  grave_ids[#grave_ids + 1] = id
  grave_records[#grave_records + 1] = id
  grave_records[#grave_records + 1] = cmsgpack.pack({h = h, code = code or '',
    message = message or '', attempts = attempts or 0, at = now})
end
-- the error code, message and attempts of a result body written by a worker (msgpack)
local function result_error(body)
  local ok, r = pcall(cmsgpack.unpack, body)
  if not ok or type(r) ~= 'table' then return '', '', 0 end
  local e = type(r.error) == 'table' and r.error or {}
  return tostring(e.code or ''), tostring(e.message or ''), tonumber(r.attempts) or 0
end
-- writes what bury() noted, then applies the cap
local function dead_letter(dead, records, stats, cap)
  if #grave_ids == 0 then return end
  bulk('ZADD', dead, grave_ids)
  bulk('HSET', records, grave_records)
  redis.call('HSET', stats, 'dead_cap', cap)
  local over = redis.call('ZCARD', dead) - cap
  if over > 0 then
    local gone = redis.call('ZRANGE', dead, 0, over - 1)
    bulk('ZREM', dead, gone)
    bulk('HDEL', records, gone)
    redis.call('HINCRBY', stats, 'dead_dropped', #gone)
  end
end
