-- Settle: what a request really cost, given to the states its charge went
-- to, quota by quota. Assembled like lua/charge.lua; one request per call
-- (settlements run off the request path).
--
-- KEYS     the client's hash, then its sliding-log sets (as in lua/charge.lua)
-- ARGV[1]  now, Unix ms ("" = Redis TIME)
-- ARGV[2]  n, the number of quotas; then 10 arguments per quota: the 6 of
--          lua/charge.lua, then the window id the charge reported, when it
--          was charged, what it charged and what the request cost (and the
--          refusal settings of a policy that waits or keeps a penalty box,
--          as lua/policy.lua reads them)
--
-- Below what was charged, each algorithm's refund gives the rest back;
-- above it, its debit charges the excess to the same window or bucket
-- (see src/algorithm/mod.rs); a policy that waits gives its GCRA charges
-- back in any order (refusal.refund). Nothing ever reaches a newer window. A refund
-- only ever brings expiry earlier, so the TTL stays; a debit that moves a
-- state's expiry later extends the key's. TTLs are relative to `now`, as in
-- lua/charge.lua, and a hash that has none after the write (it was evicted
-- and a debt made it anew) gets its policy's longest life: every key keeps
-- a TTL.
--
-- Returns the number of hash fields written.
local now = read_now(ARGV[1])
local quotas, _, r = parse_quotas(2, 10)
bind_logs(quotas, 2)
local fields = quota_fields(quotas)
if r then refusal.fields(quotas, r, fields) end
local vals = redis.call('HMGET', KEYS[1], unpack(fields))
local set = {}
local latest = nil
-- The longest a state of the policy lives (ms): a bucket with a full
-- bucket of debt, or two windows.
local life = 0
for _, q in ipairs(quotas) do
  if q.actual < q.reserved then
    if q.hi then
      -- A policy that waits: its bookings are given back in any order.
      refusal.refund(q, vals, q.id, now, q.reserved - q.actual, set)
    else
      q.alg.refund(q, vals, q.id, now, q.reserved - q.actual, set)
    end
  elseif q.actual > q.reserved then
    local e = q.alg.debit(q, vals, now, q.actual - q.reserved, set)
    if e ~= nil and (latest == nil or e > latest) then latest = e end
  end
  life = math.max(life, q.c > 0 and ceil_div(2 * q.c, q.b) or 2 * q.b)
end
if #set > 0 then
  redis.call('HSET', KEYS[1], unpack(set))
  local ttl = redis.call('PTTL', KEYS[1])
  local want = latest ~= nil and math.max(latest - now, 0) + 1000 or nil
  if ttl < 0 then
    redis.call('PEXPIRE', KEYS[1], want or life + 1000)
  elseif want ~= nil and ttl < want then
    redis.call('PEXPIRE', KEYS[1], want)
  end
end
return #set / 2
