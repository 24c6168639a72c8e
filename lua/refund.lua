-- Refund: give a charge back, quota by quota, only to the state it was
-- charged to. Assembled like lua/charge.lua; one request per call (refunds
-- run off the request path).
--
-- KEYS     the client's hash, then its sliding-log sets (as in lua/charge.lua)
-- ARGV[1]  now, Unix ms ("" = Redis TIME)
-- ARGV[2]  cost to give back
-- ARGV[3]  n, the number of quotas; then 6 arguments per quota: algorithm
--          code, field prefix, a, b, c (as in lua/charge.lua), and the
--          window id the charge reported
--
-- Each algorithm decides what may come back (see its file); nothing ever
-- exceeds what was charged or reaches a newer window. The TTL is not touched:
-- a refund only ever brings expiry earlier.
--
-- Returns the number of hash fields written.
local now = read_now(ARGV[1])
local cost = tonumber(ARGV[2])
local quotas = parse_quotas(3, 6)
bind_logs(quotas, 2)
local vals = redis.call('HMGET', KEYS[1], unpack(quota_fields(quotas)))
local set = {}
for _, q in ipairs(quotas) do
  q.alg.refund(q, vals, q.id, now, cost, set)
end
if #set > 0 then
  redis.call('HSET', KEYS[1], unpack(set))
end
return #set / 2
