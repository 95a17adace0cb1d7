--[[
  Queues requests: idempotent on the id, with priority-aware back-pressure.

  Input:
    KEYS[1] pending
    KEYS[2] seq
    KEYS[3] wake
    KEYS[4] stats
    KEYS[5] fair
    KEYS[6] inflight
    ARGV[1] prefix
    ARGV[2] packed rows of 14: id, band, payload, deadline_ms, max_attempts, reply_to, depth_limit, tenant, weight, cost, tenant_limit, slo_ms, session, prefixes
    ARGV[3] policy
    ARGV[last] optional: atomic

  A row: the id, the priority band of its score, the msgpack payload, the relative deadline
  in ms or '', max attempts, the reply inbox or '', the depth limit for its priority
  (0 = unbounded), the tenant ('' = none), its weight and the request's cost (fair shares
  inside the band: includes/fair.lua), and the tenant's limit of unfinished requests on this
  shard (0 = none; includes/tenants.lua), its latency objective in ms (0 = none), and for
  cache affinity (inferq/protocol/prefix.py) its session's identity and its prefix hash
  chain (space-separated), each '' when it has none.
  The policy is the queue's order, 'fair' or 'deadline' (includes/deadline.lua, scores.py),
  then, for admission by prediction, ' ' and the shard's service rate in requests per second
  (inferq/protocol/slo.py; the recent completion rate instead when lower and the shard holds
  half a second of work at it), then, for a bound on queued tokens, ' q' and the shard's
  bound: a request is refused ('tokens_full') when its band's estimated tokens pending
  (includes/queued.lua) plus its cost would pass it. 'atomic' last: all or none; if any new request would be refused
  (shed), every new request is refused and nothing is written.

  Output: {depth, {outcome per request}, retry_after_ms}; each outcome is 'queued',
  'pending', 'inflight', 'delayed', 'done' (a repeated id), 'full' (shed: the queue is at
  the depth limit of that priority), 'tenant_full' (the tenant is at its limit),
  'tokens_full' (its band's queued tokens would pass the bound) or
  'late:<ms>' (admission: the predicted time to its result, (ahead + running + 1) / rate,
  passes its objective; running: the shard's requests under lease). retry_after_ms estimates when the excess drains at the recent completion rate.
  Under admission, a fourth value: the predicted ms of each request with an objective that
  was queued ({row, ms} pairs).

  Reads and checks everything (whether any id is known: one EXISTS for the whole call, then
  a look at each id only when that finds one), then takes one block of sequence numbers (INCRBY), computes
  each queued request's score (priority band, then virtual finish time, then arrival), saves
  the fair clocks (one HSET) and writes each queued request with one HSET and all of them with
  one ZADD. A tenant's request fair-scored keeps what its clock was charged (F_CHARGE), so that
  its completion gives back what it did not use (complete.lua).
]]
-- @include clock
-- @include checks
-- @include rows
-- @include bulk
-- @include wake
-- @include fair
-- @include tenants
-- @include deadline
-- @include queued
-- @include affinity
-- completions per second over the last 10 full seconds, from count_done's ring of slots
local function recent_rate(stats, now)
  local sec = math.floor(now / 1000)
  local names = {}
  for s = sec - 10, sec - 1 do  -- the slots those seconds use (one HMGET)
    names[#names + 1] = 'ts:' .. s % 64
    names[#names + 1] = 'n:' .. s % 64
  end
  local got = redis.call('HMGET', stats, unpack(names))
  local total = 0
  for k = 1, #got, 2 do
    local ts = int(got[k]) or 0
    if ts >= sec - 10 and ts < sec then total = total + (int(got[k + 1]) or 0) end
  end
  return total / 10
end
local pending, seqkey, wake, stats, fair = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix = ARGV[1]
local W = 14
local A = rows(ARGV[2], W)
local atomic = ARGV[4] == 'atomic'
local words, bad = {}, false
for w in string.gmatch(ARGV[3] or '', '%S+') do words[#words + 1] = w end
local order, rate, qmax, trate, tslots = words[1], nil, nil, nil, nil
for k = 2, #words do
  local q = string.match(words[k], '^q(%d+)$')
  local tr, ts = string.match(words[k], '^t([^:]+):(%d+)$')
  if q then
    qmax = tonumber(q)
  elseif tr then
    trate, tslots = tonumber(tr), tonumber(ts)
    bad = bad or not (trate and trate > 0 and tslots >= 1)
  else
    rate = tonumber(words[k])
    bad = bad or not (rate and rate > 0)
  end
end
if not A or #ARGV < 3 or #ARGV > 4 or (#ARGV == 4 and not atomic) or bad
   or not (order == 'fair' or order == 'deadline') or (qmax and not (qmax >= 1)) then
  return redis.error_reply('ERR inferq enqueue: bad arguments')
end
local by_deadline = order == 'deadline'
-- admission: a queue that holds half a second of work at its measured completion rate is
-- saturated, and that rate (when lower) is what serves it, not the workers' fitted capacity
if rate then
  local waiting = redis.call('ZCARD', pending)
  if waiting > 0 then
    local measured = recent_rate(stats, now_ms())
    if measured > 0 and waiting >= measured * 0.5 then rate = math.min(rate, measured) end
  end
end
local n = #A
for i = 1, n, W do
  local band = int(A[i + 1], 0, BAND_WIDTH * 200)
  if not (type(A[i]) == 'string' and type(A[i + 2]) == 'string'
          and band and band % BAND_WIDTH == 0 and (A[i + 3] == '' or int(A[i + 3], 1, MAXI))
          and int(A[i + 4], 1, MAX_ATTEMPTS) and type(A[i + 5]) == 'string'
          and int(A[i + 6], 0, MAXI)
          and type(A[i + 7]) == 'string' and (A[i + 7] == '' or string.find(A[i + 7], '^[%w][%w._-]*$'))
          and int(A[i + 8], 1, FAIR_MAX_WEIGHT) and int(A[i + 9], 1, FAIR_MAX_COST)
          and int(A[i + 10], 0, MAXI) and int(A[i + 11], 0, MAX_SLO_MS)
          and affinity_ok(A[i + 12], A[i + 13])) then
    return redis.error_reply('ERR inferq enqueue: bad arguments for ' .. tostring(A[i]))
  end
end
local now = now_ms()
local depth = redis.call('ZCARD', pending)
local out, queue, seen, worst_excess = {}, {}, {}, 0
local predicted, late_ms = {}, 0
local owned = {}  -- tenant -> its unfinished requests, counting those queued by this call
local function owned_by(tn)
  if not owned[tn] then owned[tn] = int(redis.call('HGET', stats, TENANT_COUNT .. tn)) or 0 end
  return owned[tn]
end
-- how far a new request of tn would go past its limit (0: within it, or no limit)
local function tenant_excess(tn, limit)
  if tn == '' or limit == 0 then return 0 end
  return math.max(owned_by(tn) - limit + 1, 0)
end
-- the band's estimated tokens pending (read once per band), with this call's queued ones
local band_tokens, tokens_excess = {}, 0
local function tokens_of(band)
  local b = band / BAND_WIDTH
  if not band_tokens[b] then
    band_tokens[b] = int(redis.call('HGET', stats, QUEUED_TOKENS .. b)) or 0
  end
  return band_tokens[b], b
end
local WAITING = {[STATE_PENDING] = true, [STATE_INFLIGHT] = true, [STATE_DELAYED] = true}
-- one EXISTS for every id: only when it finds one is each id looked at
local known = 0
do
  local ks = {}
  for i = 1, n, W do
    ks[#ks + 1] = prefix .. K_REQ .. A[i]
    ks[#ks + 1] = prefix .. K_RESULT .. A[i]
  end
  for j = 1, #ks, CHUNK do
    known = known + redis.call('EXISTS', unpack(ks, j, math.min(j + CHUNK - 1, #ks)))
  end
end
for i = 1, n, W do
  local id = A[i]
  local rkey = prefix .. K_REQ .. id
  local limit = tonumber(A[i + 6])
  if seen[id] then
    out[#out + 1] = 'pending'  -- a repeat within this call
  elseif known > 0 and redis.call('EXISTS', rkey, prefix .. K_RESULT .. id) > 0 then
    local st = redis.pcall('HGET', rkey, F_STATE)
    if type(st) == 'string' and WAITING[st] then
      out[#out + 1] = st
    elseif redis.call('EXISTS', prefix .. K_RESULT .. id) == 1 then
      out[#out + 1] = 'done'
    else
      out[#out + 1] = 'pending'  -- a damaged hash: whoever meets it answers it
    end
  elseif limit > 0 and depth >= limit then
    out[#out + 1] = 'full'
    worst_excess = math.max(worst_excess, depth - limit + 1)
  elseif tenant_excess(A[i + 7], tonumber(A[i + 10])) > 0 then
    out[#out + 1] = 'tenant_full'
    worst_excess = math.max(worst_excess, tenant_excess(A[i + 7], tonumber(A[i + 10])))
  elseif qmax and tokens_of(tonumber(A[i + 1])) + tonumber(A[i + 9]) > qmax then
    out[#out + 1] = 'tokens_full'
    tokens_excess = math.max(tokens_excess,
                             tokens_of(tonumber(A[i + 1])) + tonumber(A[i + 9]) - qmax)
  else
    if qmax then
      local t, b = tokens_of(tonumber(A[i + 1]))
      band_tokens[b] = t + tonumber(A[i + 9])
    end
    local tn = A[i + 7]
    if tn ~= '' and tonumber(A[i + 10]) > 0 then owned[tn] = owned_by(tn) + 1 end
    depth = depth + 1
    queue[#queue + 1] = i
    seen[id] = true
    out[#out + 1] = 'queued'
  end
end
if atomic and (worst_excess > 0 or tokens_excess > 0) then  -- one was shed: all are
  queue = {}
  for k = 1, #out do
    if out[k] == 'queued' or (out[k] == 'pending' and seen[A[1 + W * (k - 1)]]) then
      out[k] = 'full'
    end
  end
end
local scores, charges = {}, {}  -- charges: row -> its fair charge (F_CHARGE), if any
if #queue > 0 then
  local last = redis.call('INCRBY', seqkey, #queue)
  for n, i in ipairs(queue) do
    local slo, seq = tonumber(A[i + 11]), last - #queue + n
    if by_deadline and slo > 0 then
      scores[n] = num(deadline_score(fair, pending, tonumber(A[i + 1]), now + slo, seq, now))
    else
      local score, charge = fair_score(fair, pending, tonumber(A[i + 1]), A[i + 7],
                                       tonumber(A[i + 8]), tonumber(A[i + 9]), seq,
                                       by_deadline and DEADLINE_SPLIT or 0)
      scores[n], charges[i] = num(score), charge
    end
  end
  fair_save(fair)
  deadline_save(fair)
  if rate or trate then  -- admission by prediction: refuse what would be late
    local kept, ks, before, highest = {}, {}, {}, -1
    local running = redis.call('ZCARD', KEYS[6])
    local mean  -- in tokens: the estimated tokens of a pending request, on average
    if trate then
      local all = int(redis.call('HGET', stats, QUEUED_TOKENS .. 'all')) or 0
      local waiting = redis.call('ZCARD', pending)
      if all > 0 and waiting > 0 then mean = all / waiting end
    end
    for n, i in ipairs(queue) do
      local slo, row, s = tonumber(A[i + 11]), (i - 1) / W + 1, tonumber(scores[n])
      local p = 0
      if slo > 0 then  -- ahead: pending with a lower score, and this call's kept ones
        local ahead = running + redis.call('ZCOUNT', pending, '-inf', '(' .. scores[n])
        if s > highest then  -- after every kept one (the usual case): no need to look
          ahead = ahead + #before
        else
          for _, other in ipairs(before) do
            if other < s then ahead = ahead + 1 end
          end
        end
        if trate then  -- a slot frees as a request finishes: those beyond the slots wait
          local finish = math.max(ahead + 1 - tslots, 0)
          p = math.ceil((finish * (mean or tonumber(A[i + 9])) + tslots) / trate * 1000)
        else
          p = math.ceil((ahead + 1) / rate * 1000)
        end
      end
      if p > slo then
        out[row] = 'late:' .. p
        late_ms = math.max(late_ms, p - slo)
      else
        if slo > 0 then
          predicted[#predicted + 1] = row
          predicted[#predicted + 1] = p
        end
        kept[#kept + 1], ks[#ks + 1], before[#before + 1] = i, scores[n], s
        if s > highest then highest = s end
      end
    end
    if #kept < #queue then
      if atomic then  -- one was late: all of them are refused
        for _, i in ipairs(kept) do out[(i - 1) / W + 1] = 'full' end
        kept, ks, predicted = {}, {}, {}
      end
      depth = depth - (#queue - #kept)
      queue, scores = kept, ks
    end
  end
end
if #queue > 0 then
  local zadd, counted, enqueued = {}, {}, num(now)
  local guess = {}  -- row -> the ms admission predicted
  for k = 1, #predicted, 2 do guess[predicted[k]] = predicted[k + 1] end
  for n, i in ipairs(queue) do
    local score = scores[n]
    local h = {F_PAYLOAD, A[i + 2], F_SCORE, score, F_STATE, STATE_PENDING, F_ATTEMPTS, 0,
               F_MAX_ATTEMPTS, A[i + 4], F_ENQUEUED, enqueued}
    if A[i + 3] ~= '' then
      h[#h + 1] = F_DEADLINE
      h[#h + 1] = num(now + tonumber(A[i + 3]))
    end
    if A[i + 5] ~= '' then
      h[#h + 1] = F_REPLY_TO
      h[#h + 1] = A[i + 5]
    end
    local p = guess[(i - 1) / W + 1]
    if p then
      h[#h + 1] = F_PREDICTED
      h[#h + 1] = p
    end
    if qmax or trate then
      h[#h + 1] = F_QUEUED
      h[#h + 1] = A[i + 9]
      queued_move(score, A[i + 9], 1)
    end
    if A[i + 12] ~= '' then
      h[#h + 1] = F_SESSION
      h[#h + 1] = A[i + 12]
    end
    if A[i + 13] ~= '' then
      h[#h + 1] = F_PREFIXES
      h[#h + 1] = A[i + 13]
    end
    if A[i + 7] ~= '' then
      h[#h + 1] = F_TENANT
      h[#h + 1] = A[i + 7]
      counted[A[i + 7]] = (counted[A[i + 7]] or 0) + 1
    end
    if charges[i] then
      h[#h + 1] = F_CHARGE
      h[#h + 1] = charges[i]
    end
    redis.call('HSET', prefix .. K_REQ .. A[i], unpack(h))
    zadd[#zadd + 1] = score
    zadd[#zadd + 1] = A[i]
  end
  bulk('ZADD', pending, zadd)
  queued_flush(stats)
  for tn, c in pairs(counted) do redis.call('HINCRBY', stats, TENANT_COUNT .. tn, c) end
  wake_workers(wake, #queue)
end
local retry_after = 0
if worst_excess > 0 then
  local rate = recent_rate(stats, now)
  if rate > 0 then
    retry_after = math.min(math.ceil(worst_excess / rate * 1000), 60000)
  else
    retry_after = 1000
  end
end
if tokens_excess > 0 then  -- when that many tokens should have drained
  local rate, t = recent_rate(stats, now), 0
  for _, v in pairs(band_tokens) do t = t + v end
  local per = depth > 0 and t / depth or 0  -- tokens per pending request, roughly
  if rate > 0 and per > 0 then
    retry_after = math.max(retry_after,
                           math.min(math.ceil(tokens_excess / (rate * per) * 1000), 60000))
  else
    retry_after = math.max(retry_after, 1000)
  end
end
if late_ms > 0 then retry_after = math.max(retry_after, math.min(late_ms, 60000)) end
if rate or trate then return {depth, out, retry_after, predicted} end
return {depth, out, retry_after}
