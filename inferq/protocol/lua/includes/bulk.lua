local CHUNK = 1000
-- one command per CHUNK elements of list (after the fixed arguments: key, and opt if given)
local function bulk(cmd, key, list, opt)
  for i = 1, #list, CHUNK do
    if opt then
      redis.call(cmd, key, opt, unpack(list, i, math.min(i + CHUNK - 1, #list)))
    else
      redis.call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
    end
  end
end
