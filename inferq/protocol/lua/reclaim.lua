--[[
  Takes back the requests of workers that are gone: every expired lease (the fallback: a
  paused or cut-off worker), and, given the ids of the workers connected now (from CLIENT
  LIST: every worker names its connections after its id), every lease of a registered worker
  whose connections have been closed for grace_ms (a killed worker loses them at once). The
  conns hash remembers, per registered worker, 'up <run>' once a sweep (or its own heartbeat)
  saw it connected to this run of the server (INFO run_id: only such a worker is judged by its connections; one
  that never named them, or has not reconnected since a restart, is left to its leases), then
  '<ms> <registry score> <run>' when a sweep first finds it without a connection; it is dead
  when it is still without one grace_ms later and has not beaten meanwhile (same score), even
  across a restart (it had lost its connections while the server ran). A
  dead worker leaves the registry and conns; so does, from conns, a worker no longer listed.
  One listing of the connections
  serves the whole fleet: a call without them answers whether one is due (none for probe_ms
  by any worker of the shard: the stats hash's liveness:probe_at), and the caller told so
  lists the connections and calls again with them.

  A request that never started (not in started) goes back to pending with its original score,
  unchanged. A run that started and was lost with its worker is not an attempt (attempts count
  failed runs): it counts in its lost runs, and the request may next run in a batch of at
  most half the one it was lost in (its cap; the run's size: the started requests of its owner
  in this call, at most its previous cap). A run lost while it ran alone (size 1) is a crash:
  at max_crashes crashes the request is dead-lettered ('crashed_worker' error result), else it
  goes back to pending and runs alone again. Damaged requests are answered 'corrupt_request';
  garbage (an inflight member without its hash) is dropped.

  Pacing (suspect_delay_ms > 0): a run lost with its worker for the first time reruns at once
  (a killed worker's batch: recovery is not delayed), but a request lost again (a half of a
  crashed batch that crashed again: the trail of a crash poison) waits in delayed until the
  queue's next suspect slot: at least suspect_delay_ms after now, and at least
  suspect_delay_ms after the slot given to the previous such group (stats
  'suspects:next_at'), so a crash poison kills at most about one worker per suspect_delay_ms
  however fast deaths are noticed, and replacement workers have time to start. The requests of
  one call share one slot (the halves of a batch still run side by side).

  Input:
    KEYS[1] inflight
    KEYS[2] pending
    KEYS[3] dead
    KEYS[4] wake
    KEYS[5] stats
    KEYS[6] started
    KEYS[7] dead_letters
    KEYS[8] leases
    KEYS[9] workers
    KEYS[10] conns
    KEYS[11] delayed
    ARGV[1] prefix
    ARGV[2] max_count
    ARGV[3] result_ttl_ms
    ARGV[4] dead_letter_cap
    ARGV[5] max_crashes
    ARGV[6] grace_ms
    ARGV[7] packed rows of 1: connected worker id ('' = no liveness check: leases only)
    ARGV[8] probe_ms (0: never ask for a listing)
    ARGV[9] suspect_delay_ms (0: a request lost again reruns at once)

  Output: {requeued, dead, {corrupt id, reason, ...}, {garbage key, ...}, requeued unstarted,
  {dead worker id, ...}, runs lost, 1 when the caller should list the connections and call
  again with them, else 0, of the requeued those paced in delayed, ms until their slot}
]]
-- @include clock
-- @include rows
-- @include request
-- @include flight
-- @include graves
-- @include stats
-- @include wake
-- @include queued
local inflight, pending, dead, wake, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local started, records, leases, workers, conns = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local delayed = KEYS[11]
local OWNER_SCAN = 10000
local prefix, max_n = ARGV[1], tonumber(ARGV[2])
local ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_crashes, grace = int(ARGV[5], 1, MAX_ATTEMPTS), int(ARGV[6], 0, MAXI)
local connected = nil
if ARGV[7] ~= '' then
  connected = rows(ARGV[7], 1)
  if connected then
    local set = {}
    for _, w in ipairs(connected) do
      if type(w) ~= 'string' then connected = nil break end
      set[w] = true
    end
    if connected then connected = set end
  end
  if not connected then return redis.error_reply('ERR inferq reclaim: bad arguments') end
end
local probe_ms = int(ARGV[8], 0, MAXI)
local pace = int(ARGV[9], 0, MAXI)
if not (max_crashes and grace and probe_ms and pace) then
  return redis.error_reply('ERR inferq reclaim: bad arguments')
end
local now = now_ms()
-- 0. is a listing of the connections due? (read here, written with the rest)
local probe_due = 0
if not connected and probe_ms > 0 then
  local last = tonumber(redis.call('HGET', stats, 'liveness:probe_at') or 0) or 0
  if now - last >= probe_ms then probe_due = 1 end
end
-- 1. liveness: registered workers seen connected before and without a connection now (read
-- only; written below)
local dead_workers, noted, cleared = {}, {}, {}
if connected then
  local was = {}
  local seen = redis.call('HGETALL', conns)
  for i = 1, #seen, 2 do was[seen[i]] = seen[i + 1] end
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '?'
  local up = 'up ' .. run
  local reg = redis.call('ZRANGE', workers, 0, -1, 'WITHSCORES')
  for i = 1, #reg, 2 do
    local w, score = reg[i], reg[i + 1]
    local mark = was[w]
    if connected[w] then
      if mark ~= up then
        noted[#noted + 1] = w
        noted[#noted + 1] = up
      end
    elseif mark then
      local t0, s0, r0 = string.match(mark, '^(%d+) (%S+) (%S+)$')
      if mark == up or (r0 == run and s0 ~= score) then
        -- first seen without a connection (or it beat since): noted from now
        noted[#noted + 1] = w
        noted[#noted + 1] = num(now) .. ' ' .. score .. ' ' .. run
      elseif t0 and s0 == score and now - tonumber(t0) >= grace then
        -- (noted before a restart too: it had lost its connections while the server ran)
        dead_workers[#dead_workers + 1] = w
      end
      -- else: still within the grace, or seen up only by an earlier run of the server
    end
    was[w] = nil
  end
  for w in pairs(was) do cleared[#cleared + 1] = w end
  for _, w in ipairs(dead_workers) do cleared[#cleared + 1] = w end
end
-- 2. the requests: expired leases, and every lease of a dead worker
local ids = redis.call('ZRANGEBYSCORE', inflight, '-inf', num(now), 'LIMIT', 0, max_n)
if #dead_workers > 0 then
  local is_dead, listed = {}, {}
  for _, w in ipairs(dead_workers) do is_dead[w] = true end
  for _, id in ipairs(ids) do listed[id] = true end
  for _, id in ipairs(redis.call('ZRANGE', inflight, 0, OWNER_SCAN - 1)) do
    if not listed[id] then
      local owner = fields(prefix .. K_REQ .. id, F_OWNER)
      if owner and owner[1] and is_dead[owner[1]] then ids[#ids + 1] = id end
    end
  end
end
-- 3. read and check every request; the size of each owner's lost run
local read = {unpack(READ)}
read[#READ + 1] = F_OWNER
read[#READ + 2] = F_CRASHES
local checked, runs = {}, {}
for i, id in ipairs(ids) do
  local h = fields(prefix .. K_REQ .. id, unpack(read))
  local kind, r = check(h)
  if kind == 'ok' then
    r.x = int(h[#READ + 2] or 0, 0, MAX_ATTEMPTS)
    if not r.x then kind, r.why = 'corrupt', 'its crash count is not an integer >= 0' end
  end
  r.ran = redis.call('SISMEMBER', started, id) == 1
  r.owner = h and h[#READ + 1] or nil
  if kind == 'ok' and r.ran then
    local o = r.owner or ''
    runs[o] = (runs[o] or 0) + 1
  end
  checked[i] = {kind, r}
end
-- 4. write
local requeue, paced, corrupt, garbage = {}, {}, {}, {}
local died, unstarted, lost = 0, 0, 0
-- the slot of this call's suspects (read now, written below if any is paced)
local slot = 0
if pace > 0 then
  local next_at = tonumber(redis.call('HGET', stats, 'suspects:next_at') or 0) or 0
  slot = math.max(now + pace, next_at)
end
for i, id in ipairs(ids) do
  local kind, r = checked[i][1], checked[i][2]
  local rkey = prefix .. K_REQ .. id
  if kind == 'ok' and not r.ran then
    redis.call('HSET', rkey, F_STATE, STATE_PENDING)
    redis.call('HDEL', rkey, F_OWNER)
    requeue[#requeue + 1] = r.s
    requeue[#requeue + 1] = id
    queued_move(r.s, r.qt, 1)
    unstarted = unstarted + 1
  elseif kind == 'ok' then
    lost = lost + 1
    local size = runs[r.owner or '']
    if r.cap and r.cap < size then size = r.cap end
    local crashes = r.x + (size <= 1 and 1 or 0)
    if crashes >= max_crashes then
      local message = 'crashed a worker while running alone ' .. crashes .. ' times (last owner '
        .. (r.owner or '?') .. '; ' .. (r.lost + 1) .. ' runs lost in all)'
      put_result(prefix, id, error_result(id, 'dead', 'crashed_worker', message, r.a, r.eq,
        now), ttl, r.rt)
      bury(rkey, id, 'crashed_worker', message, r.a, now)
      redis.call('DEL', rkey)
      tenant_done(r.tn)
      died = died + 1
    elseif pace > 0 and r.lost >= 1 then
      -- lost again: a suspect, rerun at the queue's next suspect slot
      redis.call('HSET', rkey, F_STATE, STATE_DELAYED, F_LOST, r.lost + 1, F_CRASHES, crashes,
        F_CAP, math.max(1, math.ceil(size / 2)))
      redis.call('HDEL', rkey, F_OWNER)
      paced[#paced + 1] = num(slot)
      paced[#paced + 1] = id
    else
      redis.call('HSET', rkey, F_STATE, STATE_PENDING, F_LOST, r.lost + 1, F_CRASHES, crashes,
        F_CAP, math.max(1, math.ceil(size / 2)))
      redis.call('HDEL', rkey, F_OWNER)
      requeue[#requeue + 1] = r.s
      requeue[#requeue + 1] = id
      queued_move(r.s, r.qt, 1)
    end
  else
    drop_bad(prefix, id, kind, r, now, ttl, corrupt, garbage)
  end
end
if probe_due == 1 then redis.call('HSET', stats, 'liveness:probe_at', num(now)) end
bulk('HSET', conns, noted)
bulk('HDEL', conns, cleared)
bulk('ZREM', workers, dead_workers)
land(inflight, started, leases, ids)
bulk('ZADD', pending, requeue)
if #paced > 0 then
  bulk('ZADD', delayed, paced)
  redis.call('HSET', stats, 'suspects:next_at', num(slot + pace))
end
queued_flush(stats)
flush_inboxes(prefix, ttl)
dead_letter(dead, records, stats, cap)
if died > 0 then count_done(stats, 'dead', died, now) end
if lost > 0 then redis.call('HINCRBY', stats, 'lost_runs', lost) end
local back = (#requeue + #paced) / 2
if back > 0 then
  redis.call('HINCRBY', stats, 'reclaimed', back)
  -- the paced ones: one worker wakes, claims nothing yet and learns when they are due
  wake_workers(wake, math.max(#requeue / 2, #paced > 0 and 1 or 0))
end
count_bad(stats, #corrupt / 2, #garbage, now)
tenant_flush(stats)
return {back, died, corrupt, garbage, unstarted, dead_workers, lost, probe_due, #paced / 2,
  #paced > 0 and num(slot - now) or -1}
