-- A tenant's fair-share clock as the fair hash holds it, 'f:<level>:<tenant>' =
-- '<epoch> <last> [<high>]' (includes/fair.lua, includes/refund.lua): doubles written with
-- %.17g, so they read back exactly; high (the highest finish time charged) only when it
-- differs from last (the last finish time, lowered by what completions gave back).
local function fair_number(x) return string.format('%.17g', x) end
local function fair_clock(e, last, high)
  if high == last then return e .. ' ' .. fair_number(last) end
  return e .. ' ' .. fair_number(last) .. ' ' .. fair_number(high)
end
-- epoch, last, high of a stored clock (nil when raw is not one)
local function fair_parse(raw)
  if type(raw) ~= 'string' then return nil end
  local e, f, h = string.match(raw, '^(%d+) (%S+) ?(%S*)$')
  e, f = tonumber(e), tonumber(f)
  if not (e and f) then return nil end
  return e, f, math.max(tonumber(h) or f, f)
end
