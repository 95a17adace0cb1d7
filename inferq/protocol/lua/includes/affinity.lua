-- @include clock
-- Cache affinity (inferq/protocol/prefix.py): a request's session identity and prefix hash
-- chain, as enqueue stores them. Both are '' or hex hashes of AFFINITY_HEX digits; the chain
-- has at most AFFINITY_CHAIN of them, space-separated.
local AFFINITY_SESSION_RE = '^' .. string.rep('%x', AFFINITY_HEX) .. '$'
local function affinity_ok(session, prefixes)
  if type(session) ~= 'string' or type(prefixes) ~= 'string' then return false end
  if session ~= '' and not string.find(session, AFFINITY_SESSION_RE) then return false end
  if prefixes == '' then return true end
  if #prefixes > AFFINITY_CHAIN * (AFFINITY_HEX + 1) - 1 then return false end
  if (#prefixes + 1) % (AFFINITY_HEX + 1) ~= 0 then return false end
  return string.find(prefixes, '^[%x ]+$') ~= nil
end
-- The ids a claim takes under cache affinity (inferq/worker/generate/affinity.py), in the
-- order it takes them, at most max_n, and how many of them it took by preference. Reads only.
-- The window is the first AFFINITY_WINDOW requests of the highest priority band present (at
-- or under top), in the band's fair order; nothing outside it is looked at, so no lower band
-- is ever taken while a higher one waits. Taken first: the requests of the window that are
-- due (passed over max_wait ms ago or more); then those whose longest prefix (mode 'prefix':
-- a link of its chain, or its session) or session (mode 'session') the worker holds, the
-- longest held prefix first; then the rest in fair order. skipped: the requests the plain
-- claim would have taken (the first max_n) that this one passes over and that have no
-- passed-over time yet: the caller writes it (F_SKIPPED) after its reads.
local function affinity_pick(prefix, pending, top, max_n, owner, mode, max_wait, now)
  local held = prefix .. K_HELD .. owner
  local head = redis.call('ZRANGEBYSCORE', pending, '-inf', top, 'WITHSCORES', 'LIMIT', 0, 1)
  if not head[2] or redis.call('EXISTS', held) == 0 then
    return redis.call('ZRANGEBYSCORE', pending, '-inf', top, 'LIMIT', 0, max_n), 0, {}
  end
  local band = math.floor(tonumber(head[2]) / BAND_WIDTH) * BAND_WIDTH
  local upper = '(' .. num(band + BAND_WIDTH)
  if top ~= '+inf' and tonumber(top) < band + BAND_WIDTH then upper = top end
  local window = redis.call('ZRANGEBYSCORE', pending, num(band), upper, 'LIMIT', 0,
                            math.max(AFFINITY_WINDOW, max_n))
  local due, ranked, rest, rank = {}, {}, {}, {}
  for i, id in ipairs(window) do
    local h = redis.pcall('HMGET', prefix .. K_REQ .. id, F_SESSION, F_PREFIXES, F_SKIPPED,
                          F_ENQUEUED)
    local r = 0
    if type(h) ~= 'table' or not h[4] then
      r = -2  -- not a request hash (the claim's checks answer it): taken in plain order
    else
      local skipped = tonumber(h[3])
      if skipped and now - skipped >= max_wait then
        r = -1
      elseif h[1] and redis.call('SISMEMBER', held, h[1]) == 1 then
        r = AFFINITY_CHAIN + 1  -- the session: the whole conversation so far
      elseif mode == 'prefix' and h[2] then
        local chain = {}
        for link in string.gmatch(h[2], '%x+') do chain[#chain + 1] = link end
        local found = redis.call('SMISMEMBER', held, unpack(chain))
        for k = #found, 1, -1 do
          if found[k] == 1 then r = k break end
        end
      end
    end
    rank[id] = r
    if r == -1 then due[#due + 1] = id
    elseif r > 0 then ranked[#ranked + 1] = {id, r, i}
    else rest[#rest + 1] = id end
  end
  table.sort(ranked, function(a, b)
    if a[2] ~= b[2] then return a[2] > b[2] end
    return a[3] < b[3]
  end)
  local out, taken, preferred = {}, {}, 0
  local function take(id)
    if #out < max_n then
      out[#out + 1] = id
      taken[id] = true
    end
  end
  for _, id in ipairs(due) do take(id) end
  for _, entry in ipairs(ranked) do
    if #out < max_n then preferred = preferred + 1 end
    take(entry[1])
  end
  for _, id in ipairs(rest) do take(id) end
  local skipped = {}
  for i = 1, math.min(max_n, #window) do
    local id = window[i]
    if not taken[id] and rank[id] == 0 then skipped[#skipped + 1] = id end
  end
  return out, preferred, skipped
end
