-- Helpers shared by the charge, refund and status scripts, which are each
-- assembled as: this file, lua/rate.lua, one file per algorithm, lua/policy.lua,
-- then the script's own file (lua/charge.lua, lua/refund.lua, lua/status.lua).
-- Every number handled is an integer below 2^53, exact in a Lua double.
-- A script carries only the algorithms its batch uses (src/store/redis/scripts.rs):
-- each algorithm file registers itself here under its code.

local algorithms = {}

local function push(t, ...)
  local n = #t
  for i = 1, select('#', ...) do
    t[n + i] = (select(i, ...))
  end
end

-- The most any count or backlog holds (MAX_COUNT in src/algorithm/mod.rs):
-- debt past it is dropped, so every number stays exact.
local MAX_COUNT = 9007199254740991

-- a + b, capped at MAX_COUNT (never below a).
local function add_capped(a, b)
  local s = a + b
  if s > MAX_COUNT then return math.max(a, MAX_COUNT) end
  return s
end

-- What a request of `cost` (each quota counting requests) and `units` (its
-- reservation in each quota of another unit) asks of quota q: the units that
-- must fit, and the units charged. Twin of `ask` in src/algorithm/mod.rs.
local function ask(q, cost, units)
  if q.m == 0 then return cost, cost end
  if q.m == 2 then return math.max(units, 1), units end
  return 1, units
end

-- Redis TIME as Unix ms.
local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Now, Unix ms: `arg` from the application's clock, or Redis TIME when "".
local function read_now(arg)
  return tonumber(arg) or redis_now()
end
