-- Concurrency acquire: take one in-flight slot for a key if fewer than the
-- limit are held. Slots are leased: one whose lease has ended (its instance
-- crashed, or its release never arrived) no longer counts.
--
-- KEYS[1]  the key's slots: a sorted set of slot ids scored by lease expiry
--          (Unix ms by Redis's clock), prefix .. "{" .. tag .. "}:slots"
-- KEYS[2]  tombstones, same hash tag: slot ids whose release arrived before
--          their acquire, scored by when they may be forgotten
-- ARGV[1]  the caller's time, Unix ms: only echoed back (it ties the reply
--          to its call)
-- ARGV[2]  lease, ms
-- ARGV[3]  limit: slots the key may hold
-- ARGV[4]  the slot id
--
-- Leases are timed by Redis TIME, the one clock every instance shares: an
-- instance whose clock runs ahead cannot end another instance's live lease,
-- and one whose clock runs behind cannot keep its own past their end. The
-- slots key expires one second after its latest lease (PEXPIRE), so a key
-- whose slots all leaked disappears by itself.
--
-- Returns {acquired (1/0), in_flight, time}: the unexpired slots held after
-- this call (including this one when acquired), and ARGV[1].
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local echo = tonumber(ARGV[1]) or 0
local lease = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local id = ARGV[4]

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= limit then
  return {0, held, echo}
end
if redis.call('ZSCORE', KEYS[2], id) then
  -- Released before it got here: its request is already gone.
  redis.call('ZREM', KEYS[2], id)
  return {0, held, echo}
end
redis.call('ZADD', KEYS[1], now + lease, id)
local latest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(latest[2]) - now + 1000)
return {1, held + 1, echo}
