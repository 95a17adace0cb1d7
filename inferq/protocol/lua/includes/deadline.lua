-- @include clock
-- Deadline order inside a band (scores.py): a request with a latency objective is scored
-- band + (due - base) * DEADLINE_TIE_LIMIT + seq % DEADLINE_TIE_LIMIT, where due is its
-- absolute deadline (Redis ms) and base the band's deadline base, 'd:L' in the fair hash:
-- set to now whenever none of the band's first half (below DEADLINE_SPLIT) is pending.
local deadline_bases, deadline_dirty = {}, {}
local function deadline_score(fair, pending, band, due, seq, now)
  local level = band / BAND_WIDTH
  local base = deadline_bases[level]
  if not base then
    local head = redis.call('ZRANGEBYSCORE', pending, num(band),
                            '(' .. num(band + DEADLINE_SPLIT), 'LIMIT', 0, 1)
    if head[1] then base = tonumber(redis.pcall('HGET', fair, 'd:' .. level)) end
    if not base then
      base = now
      deadline_dirty[#deadline_dirty + 1] = level
    end
    deadline_bases[level] = base
  end
  local offset = math.min(math.max(due - base, 0), DEADLINE_OFFSET_LIMIT - 1)
  return band + offset * DEADLINE_TIE_LIMIT + seq % DEADLINE_TIE_LIMIT
end
-- writes the bases deadline_score set (one HSET)
local function deadline_save(fair)
  local h = {}
  for _, level in ipairs(deadline_dirty) do
    h[#h + 1] = 'd:' .. level
    h[#h + 1] = num(deadline_bases[level])
  end
  if #h > 0 then redis.call('HSET', fair, unpack(h)) end
end
