--[[
  A generating worker's text of one decode step for every request it runs. A request whose
  lease token still matches gets its delta appended to its stream (nothing is appended when
  there are neither text nor tokens: the call then only checks the lease). A request whose
  token no longer matches was cancelled, finished elsewhere or reclaimed: nothing is
  appended, its id is returned, and when its result exists an end marker is appended so
  readers stop waiting. Stream entries: the fields of ``fields.StreamField`` (attempt, text,
  token ids: a retried or reclaimed generation goes on from them; the end marker once the
  result exists).

  Input:
    KEYS[1] inflight (names the queue's slot; per-request keys are built from prefix)
    KEYS[2] leases
    ARGV[1] prefix
    ARGV[2] result_ttl_ms
    ARGV[3..] rows of 5: id, token, attempt, text, token_ids

  token_ids: the ids of the tokens generated since the last write (decimal,
  space-separated).

  Output: the ids whose lease was lost.
]]
-- @include force
local prefix, ttl = ARGV[1], tonumber(ARGV[2])
local lost = {}
for i = 3, #ARGV, 5 do
  local id, token, attempt, delta, toks = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
    ARGV[i + 4]
  local skey = prefix .. K_STREAM .. id
  if redis.call('HGET', KEYS[2], id) == token then
    if delta ~= '' or toks ~= '' then
      force('XADD', skey, '*', SF_ATTEMPT, attempt, SF_TEXT, delta, SF_TOKENS, toks)
      redis.call('PEXPIRE', skey, ttl)
    end
  else
    lost[#lost + 1] = id
    if redis.call('EXISTS', prefix .. K_RESULT .. id) == 1 then
      force('XADD', skey, '*', SF_END, 1)
      redis.call('PEXPIRE', skey, ttl)
    end
  end
end
return lost
