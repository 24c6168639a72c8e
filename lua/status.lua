-- Status: every quota's state without charging (read-only, so replicas can
-- serve it). Assembled like lua/charge.lua.
--
-- KEYS     as in lua/charge.lua
-- ARGV     as in lua/charge.lua, with ARGV[2] (cost) = 0
--
-- Returns {1, now, block_1, ..., block_n}, as lua/charge.lua.
local now = read_now()
local quotas = parse_quotas(5)
local vals = redis.call('HMGET', KEYS[1], unpack(quota_fields(quotas)))
local out = {1, now}
for _, q in ipairs(quotas) do
  local st = q.alg.read(q, quota_vals(q, vals), now)
  if q.alg.reply then
    q.alg.reply(q, st, 0, out)
  else
    push(out, unpack(st.reply))
  end
end
return out
