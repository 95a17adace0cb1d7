-- @include checks
-- @include clock
-- Fair shares inside a priority band (inferq/protocol/cost.py; the reference model is
-- inferq/protocol/fair.py, which must agree with this file step for step).
-- The fair hash of the shard holds, per band level L (0..200, from the priority): 'e:L' its
-- epoch and 'm:L' the latest virtual finish time of the epoch; per band and tenant
-- 'f:L:<tenant>' = '<epoch> <finish>' (the tenant's last finish time). Finish times are
-- doubles written with %.17g, so they read back exactly.
local fair_bands, fair_order = {}, {}
local function fair_number(x) return string.format('%.17g', x) end
-- the band's clock: e epoch, m latest finish, v its virtual time now: the finish time of the
-- head of the band's pending requests, or (none pending) m, after a reset to a new epoch
-- once m has passed FAIR_RESET_AT
-- (tenant: the first tenant seen in the band, whose field is read in the same HMGET; the
-- reply's third value, or nil when the band was already loaded); lo: where the fair part of
-- the band starts (0, or DEADLINE_SPLIT under deadline order: scores.py)
local function fair_band(fair, pending, band, tenant, lo)
  local level = band / BAND_WIDTH
  local b = fair_bands[level]
  if b then return b, level, nil end
  local r = fields(fair, 'e:' .. level, 'm:' .. level, 'f:' .. level .. ':' .. tenant) or {}
  b = {e = tonumber(r[1]) or 0, m = tonumber(r[2]) or 0, dirty = false, tenants = {}}
  local head = redis.call('ZRANGEBYSCORE', pending, num(band + lo),
                          '(' .. num(band + BAND_WIDTH), 'WITHSCORES', 'LIMIT', 0, 1)
  if head[2] then
    b.v = math.floor((tonumber(head[2]) - band - lo) / TIE_LIMIT)
  else
    if b.m >= FAIR_RESET_AT then
      b.e, b.m, b.dirty = b.e + 1, 0, true
    end
    b.v = b.m
  end
  fair_bands[level] = b
  return b, level, r[3] or false
end
-- the score of a request of tenant (''= none) with weight and cost, arriving as number seq
-- of the shard: start = max(the tenant's last finish, the band's virtual time); finish =
-- start + cost / weight; score = band + lo + floor(finish) * TIE_LIMIT + seq % TIE_LIMIT
-- (lo: 0, or DEADLINE_SPLIT under deadline order, where finish is clamped below
-- DEADLINE_VT_LIMIT instead of VT_LIMIT)
local function fair_score(fair, pending, band, tenant, weight, cost, seq, lo)
  local b, level, raw = fair_band(fair, pending, band, tenant, lo)
  local t = b.tenants[tenant]
  if not t then
    t = {field = 'f:' .. level .. ':' .. tenant, last = 0, band = b}
    if raw == nil then raw = redis.pcall('HGET', fair, t.field) end
    if type(raw) == 'string' then
      local e, f = string.match(raw, '^(%d+) (%S+)$')
      if e and tonumber(e) == b.e and tonumber(f) then t.last = tonumber(f) end
    end
    b.tenants[tenant] = t
    fair_order[#fair_order + 1] = t
  end
  local finish = math.max(t.last, b.v) + cost / weight
  t.last = finish
  if finish > b.m then b.m, b.dirty = finish, true end
  local vt = math.min(math.floor(finish), (lo > 0 and DEADLINE_VT_LIMIT or VT_LIMIT) - 1)
  return band + lo + vt * TIE_LIMIT + seq % TIE_LIMIT
end
-- writes the clocks fair_score moved (one HSET)
local function fair_save(fair)
  local h = {}
  for level, b in pairs(fair_bands) do
    if b.dirty then
      h[#h + 1] = 'e:' .. level
      h[#h + 1] = b.e
      h[#h + 1] = 'm:' .. level
      h[#h + 1] = fair_number(b.m)
    end
  end
  for _, t in ipairs(fair_order) do
    h[#h + 1] = t.field
    h[#h + 1] = t.band.e .. ' ' .. fair_number(t.last)
  end
  if #h > 0 then redis.call('HSET', fair, unpack(h)) end
end
