-- Per-tenant counts of unfinished requests (waiting, running or waiting for a retry) in the
-- shard's stats hash, field TENANT_COUNT .. <tenant>: enqueue adds, every script that writes
-- a request's final result (and deletes its hash) takes away, once per tenant per call
-- (tenant_flush). Requests without a tenant are not counted. Read by the tenant quota
-- (enqueue) and inferq stats.
local tenant_gone, tenant_gone_order = {}, {}
local function tenant_done(tn)
  if type(tn) == 'string' and tn ~= '' then
    if not tenant_gone[tn] then
      tenant_gone[tn] = 0
      tenant_gone_order[#tenant_gone_order + 1] = tn
    end
    tenant_gone[tn] = tenant_gone[tn] + 1
  end
end
local function tenant_flush(stats)
  for _, tn in ipairs(tenant_gone_order) do
    local field = TENANT_COUNT .. tn
    if redis.call('HINCRBY', stats, field, -tenant_gone[tn]) <= 0 then
      redis.call('HDEL', stats, field)
    end
  end
end
