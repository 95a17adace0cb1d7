-- @include bulk
-- @include force
-- Results: written once per request (the caller holds the proof that none exists yet: a
-- matching lease token, or the request hash itself); those whose request named a reply inbox
-- (a client waiting on many results over one connection) are also pushed there as
-- "<id> <result>" (ids never contain a space), once per inbox per call by flush_inboxes,
-- which trims and expires each inbox once.
local INBOX_CAP = 100000
local inboxes, inbox_order = {}, {}
local function put_result(prefix, id, body, ttl, rt)
  local k = prefix .. K_RESULT .. id
  force('RPUSH', k, body)
  redis.call('PEXPIRE', k, ttl)
  if rt and rt ~= '' then
    local l = inboxes[rt]
    if not l then
      l = {}
      inboxes[rt] = l
      inbox_order[#inbox_order + 1] = rt
    end
    l[#l + 1] = id .. ' ' .. body
  end
end
local function flush_inboxes(prefix, ttl)
  for _, rt in ipairs(inbox_order) do
    local inbox = prefix .. K_INBOX .. rt
    local l = inboxes[rt]
    for i = 1, #l, CHUNK do
      force('RPUSH', inbox, unpack(l, i, math.min(i + CHUNK - 1, #l)))
    end
    redis.call('LTRIM', inbox, -INBOX_CAP, -1)
    redis.call('PEXPIRE', inbox, ttl)
  end
end
-- A result answered by a script: a ``codec.Result`` with an error (the test of the result
-- schema decodes what this writes with the model). attempts and enqueued: validated
-- integers, or nil (left out of the result).
local function error_result(id, status, code, message, attempts, enqueued, now)
  return cmsgpack.pack({v = RESULT_VERSION, id = id, status = status,
    error = {code = code, message = message},
    attempts = attempts or 0, enqueued_ms = enqueued, finished_ms = now})
end
