-- Helpers shared by the charge, refund and status scripts, which are each
-- assembled as: this file, lua/rate.lua, one file per algorithm, then the
-- script's own file (lua/charge.lua, lua/refund.lua, lua/status.lua).
-- Every number handled is an integer below 2^53, exact in a Lua double.

local function push(t, ...)
  for i = 1, select('#', ...) do
    t[#t + 1] = select(i, ...)
  end
end

-- Now, Unix ms: ARGV[1] from the application's clock, or Redis TIME when "".
local function read_now()
  local now = tonumber(ARGV[1])
  if now == nil then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
