-- @include clock
-- Billable usage: per tenant (requests without one are not counted: they cost nothing here),
-- the final results a worker wrote and their prompt and
-- completion tokens (embeddings: input tokens as prompt tokens), in the shard's usage hash of
-- the current hour (K_USAGE .. <unix ms // 3600000>, field <tenant>|<counter>), expiring
-- USAGE_RETENTION_MS after its hour, and in the shard's all-time totals (K_USAGE .. 'total',
-- what the Prometheus counters read). Counted only where a first result is written (the lease
-- token matched), so a refused zombie or a repeated write counts nothing: once per request.
-- One HINCRBY per tenant and counter per call and key (usage_flush), not per request; the hour's
-- expiry is set when a tenant's first count of the hour creates its field.
local usage_of, usage_order = {}, {}
local function usage_add(tn, prompt, completion)
  if tn == '' then return end
  local u = usage_of[tn]
  if not u then
    u = {0, 0, 0}
    usage_of[tn] = u
    usage_order[#usage_order + 1] = tn
  end
  u[1], u[2], u[3] = u[1] + 1, u[2] + prompt, u[3] + completion
end
local function usage_flush(prefix, now)
  if #usage_order == 0 then return end
  local hour = math.floor(now / 3600000)
  local key = prefix .. K_USAGE .. num(hour)
  local new = false
  for _, k in ipairs({key, prefix .. K_USAGE .. 'total'}) do
    for _, tn in ipairs(usage_order) do
      local u = usage_of[tn]
      if redis.call('HINCRBY', k, tn .. '|requests', u[1]) == u[1] and k == key then
        new = true
      end
      if u[2] > 0 then redis.call('HINCRBY', k, tn .. '|prompt_tokens', u[2]) end
      if u[3] > 0 then redis.call('HINCRBY', k, tn .. '|completion_tokens', u[3]) end
    end
  end
  if new then redis.call('PEXPIREAT', key, num((hour + 1) * 3600000 + USAGE_RETENTION_MS)) end
end
