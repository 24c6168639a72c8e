-- Fixed window refund: give a charge back, only to the window it was charged to.
--
-- KEYS[1]  the client's hash (as in fixed_window.lua)
-- ARGV[1]  now, Unix ms ("" = Redis TIME)
-- ARGV[2]  cost to give back
-- ARGV[3]  n, the number of quotas; then for each quota i (1-based):
-- ARGV[2i+2]  field prefix
-- ARGV[2i+3]  the reset of the window that was charged
--
-- A quota whose stored reset differs (a newer window) or has passed is left
-- alone; a count never goes below zero. The TTL is not touched.
--
-- Returns the number of quotas refunded.
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local cost = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local done = 0
for i = 1, n do
  local p = ARGV[2 * i + 2]
  local charged_reset = tonumber(ARGV[2 * i + 3])
  local vals = redis.call('HMGET', KEYS[1], p .. 'c', p .. 'r')
  local c = tonumber(vals[1])
  local r = tonumber(vals[2])
  if c ~= nil and r ~= nil and r == charged_reset and r > now then
    local left = c - cost
    if left < 0 then left = 0 end
    redis.call('HSET', KEYS[1], p .. 'c', left)
    done = done + 1
  end
end
return done
