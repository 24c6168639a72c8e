-- Concurrency release: give a slot back.
--
-- KEYS[1]  the key's slots (as in concurrency_acquire.lua)
-- KEYS[2]  tombstones (as in concurrency_acquire.lua)
-- ARGV[1]  the caller's time, Unix ms (unused: leases are timed by Redis TIME)
-- ARGV[2]  lease, ms: how long a tombstone is kept
-- ARGV[3]  the slot id
--
-- A slot that is not held was either freed by its lease already, or its
-- acquire has not arrived yet (it timed out or was abandoned, and took
-- another connection): a tombstone makes that late acquire fail. Tombstones
-- expire with the lease, by Redis's clock.
--
-- Returns 1 if the slot was held and is now free, 0 if a tombstone was left.
if redis.call('ZREM', KEYS[1], ARGV[3]) == 1 then
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[3])
local latest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[2], tonumber(latest[2]) - now + 1000)
return 0
