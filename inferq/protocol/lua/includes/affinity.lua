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
