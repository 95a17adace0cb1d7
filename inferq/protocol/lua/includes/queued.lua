-- Estimated tokens pending per priority band (inferq queue set --max-queued-tokens): field
-- QUEUED_TOKENS .. <band index> (100 - priority) of the shard's stats hash. A request whose
-- hash has F_QUEUED (written by enqueue while the queue has a bound) counts those tokens while
-- it is in pending: every script that puts it into pending adds them, every one that takes
-- it out takes them away (queued_move for each, then queued_flush: one HINCRBY per band).
-- A count that reaches 0 or less is deleted. QUEUED_TOKENS .. 'all' is the sum over bands.
local queued_delta, queued_bands = {}, {}
local function queued_move(score, tokens, sign)
  local t, s = tonumber(tokens), tonumber(score)
  if not t or t <= 0 or not s then return end
  local b = math.floor(s / BAND_WIDTH)
  if not queued_delta[b] then
    queued_delta[b] = 0
    queued_bands[#queued_bands + 1] = b
  end
  queued_delta[b] = queued_delta[b] + sign * t
end
local function queued_add(stats, field, delta)
  if delta ~= 0 and redis.call('HINCRBY', stats, field, delta) <= 0 then
    redis.call('HDEL', stats, field)
  end
end
local function queued_flush(stats)
  local total = 0
  for _, b in ipairs(queued_bands) do
    queued_add(stats, QUEUED_TOKENS .. b, queued_delta[b])
    total = total + queued_delta[b]
  end
  queued_add(stats, QUEUED_TOKENS .. 'all', total)
  queued_delta, queued_bands = {}, {}
end
