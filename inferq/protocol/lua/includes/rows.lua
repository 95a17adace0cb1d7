-- The per-request values of a call, packed by the caller into one msgpack array (a flat run
-- of `width` values per request: one argument instead of thousands, see ``ops.packed``): the
-- array, or nil when it is not an array whose length is a multiple of width. Each script
-- checks the type of every value it uses in its read pass, before its first write.
local function rows(blob, width)
  local ok, t = pcall(cmsgpack.unpack, blob or '')
  if not ok or type(t) ~= 'table' or #t % width ~= 0 then return nil end
  return t
end
local function strings(a, b) return type(a) == 'string' and type(b) == 'string' end
