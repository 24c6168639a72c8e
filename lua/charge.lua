-- Charge: every quota of a policy, all or nothing, in one call, whatever
-- their algorithms. Assembled after lua/prelude.lua, lua/rate.lua and the
-- algorithm files (src/store/redis/scripts.rs); the shared vectors in tests/
-- keep each algorithm equal to its twin in src/algorithm/.
--
-- KEYS[1]  the client's hash: prefix .. "{" .. tag .. "}" (all scalar state)
-- KEYS[2..] one sorted set per sliding-log quota, in policy order: the hash's
--          key .. ":" .. field prefix (same {tag}, same slot)
-- ARGV[1]  now, Unix ms, from the application's clock; "" = use Redis TIME
-- ARGV[2]  cost (units to charge)
-- ARGV[3]  n, the number of quotas; then for each quota i (1-based), at
--          ARGV[5i-1 .. 5i+3]:
--            algorithm code: fw, tb, sw, gc or sl
--            field prefix (algorithm and window, e.g. "tb60000")
--            a, b, c: the algorithm's arguments (see its file)
--
-- Reads every quota's fields with one HMGET, decides, and only if every
-- quota admits the cost writes them all with one HSET (and the logs), then
-- sets PEXPIREAT one second after the latest expiry. A rejection writes nothing.
--
-- Returns {allowed (1/0), now, block_1, ..., block_n}: each quota's state as
-- read, before this call's charge (block layouts in the algorithm files).
-- The application derives every header from this reply.
local now = read_now()
local cost = tonumber(ARGV[2])
local quotas = parse_quotas(5)
local vals = redis.call('HMGET', KEYS[1], unpack(quota_fields(quotas)))

local allowed = 1
for _, q in ipairs(quotas) do
  q.st = q.alg.read(q, quota_vals(q, vals), now)
  if not q.alg.fits(q, q.st, cost) then allowed = 0 end
end

local out = {0, now}
for _, q in ipairs(quotas) do
  if q.alg.reply then
    q.alg.reply(q, q.st, cost, out)
  else
    push(out, unpack(q.st.reply))
  end
end

if allowed == 1 then
  local set = {}
  local latest = 0
  for _, q in ipairs(quotas) do
    local e = q.alg.write(q, q.st, cost, now, set)
    if e > latest then latest = e end
  end
  redis.call('HSET', KEYS[1], unpack(set))
  redis.call('PEXPIREAT', KEYS[1], math.max(latest, now) + 1000)
end
out[1] = allowed
return out
