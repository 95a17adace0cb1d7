-- @include checks
-- @include clock
-- @include fairclock
-- Fair shares inside a priority band (inferq/protocol/cost.py; the reference model is
-- inferq/protocol/fair.py, which must agree with this file step for step).
-- The fair hash of the shard holds, per band level L (0..200, from the priority): 'e:L' its
-- epoch and 'm:L' the latest virtual finish time of the epoch; per band and tenant
-- 'f:L:<tenant>' = '<epoch> <last> [<high>]': the tenant's last finish time, lowered by what
-- its completed requests gave back (includes/refund.lua), and the highest finish time it was
-- charged, written only when it differs from last. Finish times are doubles written with
-- %.17g, so they read back exactly.
local fair_bands, fair_order = {}, {}
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
-- of the shard: start = the tenant's last finish if its highest finish >= the band's virtual
-- time (it is backlogged), else the band's virtual time; finish =
-- start + cost / weight; score = band + lo + floor(finish) * TIE_LIMIT + seq % TIE_LIMIT
-- (lo: 0, or DEADLINE_SPLIT under deadline order, where finish is clamped below
-- DEADLINE_VT_LIMIT instead of VT_LIMIT); second value: the charge to store in the request
-- hash (F_CHARGE, '<level> <epoch> <weight> <cost>': includes/refund.lua gives back from it
-- what the request did not use), nil for tenant '' (one FIFO flow: it gets nothing back)
local function fair_score(fair, pending, band, tenant, weight, cost, seq, lo)
  local b, level, raw = fair_band(fair, pending, band, tenant, lo)
  local t = b.tenants[tenant]
  if not t then
    t = {field = 'f:' .. level .. ':' .. tenant, last = 0, high = 0, band = b}
    if raw == nil then raw = redis.pcall('HGET', fair, t.field) end
    local e, last, high = fair_parse(raw)
    if e == b.e then t.last, t.high = last, high end
    b.tenants[tenant] = t
    fair_order[#fair_order + 1] = t
  end
  -- a tenant still backlogged (its highest finish not passed by the band's head) starts at
  -- its own clock, given-back tokens included; one that was not starts at the head
  local start = b.v
  if t.high >= b.v then start = t.last end
  local finish = start + cost / weight
  t.last = finish
  if finish > t.high then t.high = finish end
  if finish > b.m then b.m, b.dirty = finish, true end
  local vt = math.min(math.floor(finish), (lo > 0 and DEADLINE_VT_LIMIT or VT_LIMIT) - 1)
  local charge = nil
  if tenant ~= '' then charge = level .. ' ' .. b.e .. ' ' .. weight .. ' ' .. cost end
  return band + lo + vt * TIE_LIMIT + seq % TIE_LIMIT, charge
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
    h[#h + 1] = fair_clock(t.band.e, t.last, t.high)
  end
  if #h > 0 then redis.call('HSET', fair, unpack(h)) end
end
