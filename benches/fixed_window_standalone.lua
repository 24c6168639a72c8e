-- A standalone copy of the fixed-window charge script as it was before the
-- algorithms were assembled into lua/charge.lua: the naive baseline of
-- tools/src/bin/bench_server.rs runs it, and benches/redis.rs gives its raw
-- redis-benchmark figures (the performance targets' reference numbers are for it).
--
-- Fixed window charge: all quotas of a policy, all or nothing, in one call.
-- Twin of src/algorithm/fixed_window.rs; the shared vectors in tests/ keep them equal.
--
-- KEYS[1]  the client's hash: prefix .. "{" .. tag .. "}" (one key, one slot)
-- ARGV[1]  now, Unix ms, from the application's clock; "" = use Redis TIME
-- ARGV[2]  cost (units to charge)
-- ARGV[3]  n, the number of quotas; then for each quota i (1-based):
-- ARGV[3i+1]  field prefix (algorithm and window, e.g. "fw60000")
-- ARGV[3i+2]  limit
-- ARGV[3i+3]  window, ms
--
-- Hash fields: <prefix>c = units charged in the window, <prefix>r = the
-- window's stored reset (Unix ms). A window whose reset has passed is
-- discarded, whatever TTL the key still has (replicas, clock skew).
-- The key expires one second after the latest reset written (PEXPIREAT).
--
-- Returns {allowed (1/0), now, c_1, r_1, ..., c_n, r_n}: each quota's count
-- and reset as read (stale windows already replaced by fresh ones), before
-- this call's charge. The application derives every header from this reply.
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local cost = tonumber(ARGV[2])
local n = tonumber(ARGV[3])

local fields = {}
for i = 1, n do
  local p = ARGV[3 * i + 1]
  fields[2 * i - 1] = p .. 'c'
  fields[2 * i] = p .. 'r'
end
local vals = redis.call('HMGET', KEYS[1], unpack(fields))

local out = {0, now}
local allowed = 1
for i = 1, n do
  local limit = tonumber(ARGV[3 * i + 2])
  local c = tonumber(vals[2 * i - 1])
  local r = tonumber(vals[2 * i])
  if c == nil or r == nil or r <= now then
    c = 0
    r = now + tonumber(ARGV[3 * i + 3])
  end
  out[2 * i + 1] = c
  out[2 * i + 2] = r
  if cost > limit or c + cost > limit then
    allowed = 0
  end
end

if allowed == 1 then
  local set = {}
  local latest = 0
  for i = 1, n do
    local r = out[2 * i + 2]
    set[4 * i - 3] = fields[2 * i - 1]
    set[4 * i - 2] = out[2 * i + 1] + cost
    set[4 * i - 1] = fields[2 * i]
    set[4 * i] = r
    if r > latest then latest = r end
  end
  redis.call('HSET', KEYS[1], unpack(set))
  redis.call('PEXPIREAT', KEYS[1], latest + 1000)
end
out[1] = allowed
return out
