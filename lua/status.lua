-- Status: every quota's state without charging (read-only, so replicas can
-- serve it). Assembled like lua/charge.lua; one request per call.
--
-- KEYS     the client's hash, then its sliding-log sets (as in lua/charge.lua)
-- ARGV[1]  now, Unix ms ("" = Redis TIME)
-- ARGV[2]  n, the number of quotas; then 6 arguments per quota (as in
--          lua/charge.lua; and the refusal settings of a policy that waits
--          or keeps a penalty box, as lua/policy.lua reads them)
--
-- Returns {1, now, block_1, ..., block_n}, as lua/charge.lua, then for a
-- policy that keeps a penalty box the box as stored (n, s, b: see
-- lua/refusal.lua).
local now = read_now(ARGV[1])
local quotas, _, r = parse_quotas(2, 6)
bind_logs(quotas, 2)
local fields = quota_fields(quotas)
if r then refusal.fields(quotas, r, fields) end
local vals = redis.call('HMGET', KEYS[1], unpack(fields))
local out = {1, now}
for _, q in ipairs(quotas) do
  q.alg.reply(q, q.alg.read(q, vals, now), 0, out)
end
if r and r.pfx then push(out, penalty_read(r, vals)) end
return out
