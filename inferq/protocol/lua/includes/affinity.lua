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
-- order it takes them, at most max_n; how many of them it took by preference; the ids it
-- passed over that the plain claim would have taken (the caller notes when: F_SKIPPED); and
-- the ms until the earliest passed-over request of the window becomes due (-1: none).
-- The window is the first AFFINITY_WINDOW requests of the highest priority band present (at
-- or under top), in the band's fair order; nothing outside it is looked at, so no lower band
-- is ever taken while a higher one waits. A request's rank for a worker: the length of the
-- longest link of its chain in the worker's held set (mode 'prefix'), or AFFINITY_CHAIN + 1
-- when the worker holds its session. A request that another live worker, not saturated,
-- ranks higher is left for it (sticky until saturated). Taken first: the requests of the
-- window that are due (passed over max_wait ms ago or more); then those this worker ranks
-- highest, the highest first; then the rest in fair order.
local function affinity_rank(held, mode, session, chain)
  if session and redis.call('SISMEMBER', held, session) == 1 then return AFFINITY_CHAIN + 1 end
  if mode ~= 'prefix' or #chain == 0 then return 0 end
  local found = redis.call('SMISMEMBER', held, unpack(chain))
  for k = #found, 1, -1 do
    if found[k] == 1 then return k end
  end
  return 0
end
local function affinity_pick(prefix, pending, workers, top, max_n, owner, mode, max_wait, now)
  local held = prefix .. K_HELD .. owner
  local head = redis.call('ZRANGEBYSCORE', pending, '-inf', top, 'WITHSCORES', 'LIMIT', 0, 1)
  if not head[2] then return {}, 0, {}, -1 end
  -- the other live workers that publish a held set and are not saturated
  local others = {}
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', workers, num(now), '+inf')) do
    local key = prefix .. K_HELD .. w
    if w ~= owner and redis.call('SISMEMBER', key, AFFINITY_SATURATED) == 0
       and redis.call('EXISTS', key) == 1 then
      others[#others + 1] = key
    end
  end
  local mine = redis.call('EXISTS', held) == 1
  if not mine and #others == 0 then
    return redis.call('ZRANGEBYSCORE', pending, '-inf', top, 'LIMIT', 0, max_n), 0, {}, -1
  end
  local band = math.floor(tonumber(head[2]) / BAND_WIDTH) * BAND_WIDTH
  local upper = '(' .. num(band + BAND_WIDTH)
  if top ~= '+inf' and tonumber(top) < band + BAND_WIDTH then upper = top end
  local window = redis.call('ZRANGEBYSCORE', pending, num(band), upper, 'LIMIT', 0,
                            math.max(AFFINITY_WINDOW, max_n))
  local due, ranked, rest, kind, since = {}, {}, {}, {}, {}
  for i, id in ipairs(window) do
    local h = redis.pcall('HMGET', prefix .. K_REQ .. id, F_SESSION, F_PREFIXES, F_SKIPPED,
                          F_ENQUEUED)
    local k = 'bad'
    if type(h) == 'table' and h[4] then
      k = 'rest'
      local skipped = tonumber(h[3])
      since[id] = skipped
      if skipped and now - skipped >= max_wait then
        k = 'due'
      else
        local chain = {}
        if h[2] then
          for link in string.gmatch(h[2], '%x+') do chain[#chain + 1] = link end
        end
        local session = h[1] or nil
        local r = mine and affinity_rank(held, mode, session, chain) or 0
        local best = 0
        for _, key in ipairs(others) do
          best = math.max(best, affinity_rank(key, mode, session, chain))
        end
        if best > r then k = 'theirs'
        elseif r > 0 then
          k = 'mine'
          ranked[#ranked + 1] = {id, r, i}
        end
      end
    end  -- 'bad': not a request hash (the claim's checks answer it), taken in plain order
    kind[id] = k
    if k == 'due' then due[#due + 1] = id
    elseif k == 'rest' or k == 'bad' then rest[#rest + 1] = id end
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
  local skipped, next_due = {}, -1
  for i, id in ipairs(window) do
    local k = kind[id]
    if not taken[id] and k ~= 'bad' and k ~= 'due' then
      local first = since[id]
      if not first and i <= max_n then  -- the plain claim would have taken it now
        skipped[#skipped + 1] = id
        first = now
      end
      if first and k == 'theirs' then  -- left for its holder: due at first + max_wait
        local wait = math.max(first + max_wait - now, 0)
        if next_due < 0 or wait < next_due then next_due = wait end
      end
    end
  end
  return out, preferred, skipped, next_due
end
