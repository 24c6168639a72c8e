-- Shared limits: makes the policy running in shadow the default, inside
-- Redis, so that a shadow set meanwhile by another instance is the one
-- promoted (src/store/redis/table.rs).
--
-- KEYS[1]  the limits' hash (fields `default`, `shadow`, `key:TEXT`)
--
-- Returns 1 if there was a shadow policy to promote, else 0.
local s = redis.call('HGET', KEYS[1], 'shadow')
if not s then return 0 end
redis.call('HSET', KEYS[1], 'default', s)
redis.call('HDEL', KEYS[1], 'shadow')
return 1
