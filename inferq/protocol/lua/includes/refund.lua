-- @include fairclock
-- A tenant's request whose result is written gives back to its tenant's fair-share clock what
-- its enqueue charged and it did not use (a generation that stopped early): the charge
-- (F_CHARGE, '<level> <epoch> <weight> <cost>', includes/fair.lua) minus the tokens it used,
-- divided by its weight, comes off the tenant's last finish time 'f:<level>:<tenant>' of the
-- fair hash (not off its highest: includes/fairclock.lua), if that clock is still of the
-- charge's epoch. Its next request starts that much earlier if it is still backlogged then
-- (includes/fair.lua); one that was not starts at the band's head as ever, so nothing banks.
-- Only gives back: a request that used more than its estimate is not charged again (its place
-- was decided at enqueue).
-- The reference model is FairShard.complete (inferq/protocol/fair.py): same steps, same order
-- (rows in order, each on the clock as the previous ones left it).
-- fair_refund reads (HGET through pcall: a damaged key is skipped, never raised on);
-- refund_save writes every clock it moved with one HSET.
local refund_clocks, refund_order = {}, {}
local function fair_refund(fair, rkey, tenant, used)
  if tenant == '' or used <= 0 then return end
  local charge = redis.pcall('HGET', rkey, F_CHARGE)
  if type(charge) ~= 'string' then return end
  local level, e, w, c = string.match(charge, '^(%d+) (%d+) (%d+) (%d+)$')
  e, w, c = tonumber(e), tonumber(w), tonumber(c)
  if not level or w < 1 or used >= c then return end
  local field = 'f:' .. level .. ':' .. tenant
  local t = refund_clocks[field]
  if not t then
    t = {}
    t.e, t.last, t.high = fair_parse(redis.pcall('HGET', fair, field))
    refund_clocks[field] = t
  end
  if t.e ~= e or not t.last then return end
  t.last = math.max(0, t.last - (c - used) / w)
  if not t.dirty then
    t.dirty = true
    refund_order[#refund_order + 1] = field
  end
end
local function refund_save(fair)
  local h = {}
  for _, field in ipairs(refund_order) do
    local t = refund_clocks[field]
    h[#h + 1] = field
    h[#h + 1] = fair_clock(t.e, t.last, t.high)
  end
  if #h > 0 then redis.call('HSET', fair, unpack(h)) end
end
