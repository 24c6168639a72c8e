-- Sliding log: twin of src/algorithm/sliding_log.rs. Part of the charge,
-- refund and status scripts (see lua/charge.lua for KEYS, ARGV and replies;
-- lua/fixed_window.lua for the functions every algorithm file defines).
--
-- Quota arguments: q.a = limit (at most 10,000), q.b = window (ms).
-- State: the hash field <prefix>n = total cost logged, and the log itself,
-- a sorted set at q.key (the hash's key + ":" + prefix, same hash slot):
-- one member "<ms>:<cost>" per millisecond with a charge, scored by its ms.
-- An entry at t counts while t > now - window. Rejections write nothing:
-- expired entries are removed (and the total lowered) on the next admission.
-- Reply block: {live total, newest entry ms (0: none), retry at}: when
-- this quota admits the cost asked, only when it rejects it (0 otherwise).
-- The retry is found by walking the oldest live entries with a score
-- cursor, at most SL_MAX_WALK of them; past that it is when the newest
-- entry slides out (later than the truth, never earlier). So a rejection's
-- work and reply are bounded, whatever the log holds (twin of `retry_at` in
-- src/algorithm/sliding_log.rs).
local sliding_log = {suffixes = {'n'}, log = true}

-- The most entries a rejection walks (MAX_WALK in src/algorithm/sliding_log.rs).
local SL_MAX_WALK = 256

local function entry_cost(member)
  return tonumber(string.sub(member, string.find(member, ':', 1, true) + 1))
end

local function entry(t, c)
  return string.format('%d:%d', t, c)
end

function sliding_log.read(q, v, now)
  local cutoff = now - q.b
  local total = tonumber(v[q.first]) or 0
  local expired = redis.call('ZRANGEBYSCORE', q.key, '-inf', cutoff)
  for _, m in ipairs(expired) do
    total = total - entry_cost(m)
  end
  local last = redis.call('ZRANGE', q.key, -1, -1, 'WITHSCORES')
  local newest = tonumber(last[2])
  -- The log gone but the total left (a partial eviction): nothing is live.
  if newest == nil or newest <= cutoff or total < 0 then
    total = 0
  end
  if newest ~= nil and newest <= cutoff then newest = nil end
  return {total = total, newest = newest, expired = #expired, cutoff = cutoff}
end

function sliding_log.fits(q, st, cost)
  return cost <= q.a and st.total + cost <= q.a
end

-- Appends the reply block; on a rejection by this quota, when enough of
-- the oldest live entries will have slid out to admit `cost`.
function sliding_log.reply(q, st, cost, out)
  local retry = 0
  if not sliding_log.fits(q, st, cost) and cost <= q.a then
    retry = st.newest and st.newest + q.b or st.cutoff + q.b
    local need = st.total + cost - q.a
    local freed, walked, found = 0, 0, false
    -- Entries are one per ms: an exclusive score cursor never repeats one.
    local cursor = '(' .. string.format('%d', st.cutoff)
    while not found and walked < SL_MAX_WALK do
      local batch = redis.call('ZRANGEBYSCORE', q.key, cursor, '+inf', 'WITHSCORES',
        'LIMIT', 0, math.min(64, SL_MAX_WALK - walked))
      if #batch == 0 then break end
      for j = 1, #batch, 2 do
        walked = walked + 1
        freed = freed + entry_cost(batch[j])
        if freed >= need then
          retry = tonumber(batch[j + 1]) + q.b
          found = true
          break
        end
      end
      cursor = '(' .. batch[#batch]
    end
  end
  push(out, st.total, st.newest or 0, retry)
end

function sliding_log.write(q, st, cost, now, set)
  if st.expired > 0 then
    redis.call('ZREMRANGEBYSCORE', q.key, '-inf', st.cutoff)
  end
  push(set, q.f.n, st.total + cost)
  local newest = st.newest
  if cost > 0 then
    -- One member per ms: merge with an entry already logged at `now`.
    local at_now = {}
    if newest ~= nil and newest >= now then
      at_now = redis.call('ZRANGEBYSCORE', q.key, now, now)
    end
    local c = cost
    if #at_now > 0 then
      c = c + entry_cost(at_now[1])
    end
    redis.call('ZADD', q.key, now, entry(now, c))
    if #at_now > 0 then
      redis.call('ZREM', q.key, at_now[1])
    end
    if newest == nil or now > newest then newest = now end
  end
  if newest == nil then return 0, true end
  -- Relative to `now` (never an absolute time Redis judges by its own clock).
  redis.call('PEXPIRE', q.key, newest + q.b + 1000 - now)
  return newest + q.b, true
end

-- Takes up to `cost` back from the entry logged at `id`, if it is still there.
function sliding_log.refund(q, v, id, now, cost, set)
  local found = redis.call('ZRANGEBYSCORE', q.key, id, id)
  if #found == 0 then return end
  local c = entry_cost(found[1])
  local give = math.min(cost, c)
  -- Nothing to give (a zero cost): the reduced entry would be the same
  -- member, and removing "the old one" would delete the charge.
  if give <= 0 then return end
  -- Add the reduced entry before removing the old one: emptying the set
  -- would delete the key, and re-creating it would drop its TTL.
  if c > give then
    redis.call('ZADD', q.key, id, entry(id, c - give))
  end
  redis.call('ZREM', q.key, found[1])
  -- A total that is gone (the hash was evicted) is not written back: that
  -- would make a hash with no TTL.
  local total = tonumber(v[q.first])
  if total ~= nil then push(set, q.f.n, math.max(total - give, 0)) end
end

-- Debt: `extra` more on the entry logged at `id`, while it is within the
-- window (an entry made if the charge logged nothing).
function sliding_log.debit(q, v, now, extra, set)
  if q.id + q.b <= now or extra <= 0 then return end
  local found = redis.call('ZRANGEBYSCORE', q.key, q.id, q.id)
  local c = #found > 0 and entry_cost(found[1]) or 0
  local total = tonumber(v[q.first]) or 0
  extra = add_capped(total, extra) - total
  if extra <= 0 then return end
  redis.call('ZADD', q.key, q.id, entry(q.id, c + extra))
  if #found > 0 then redis.call('ZREM', q.key, found[1]) end
  if redis.call('PTTL', q.key) < 0 then
    redis.call('PEXPIRE', q.key, q.id + q.b + 1000 - now)
  end
  push(set, q.f.n, total + extra)
  return q.id + q.b
end

algorithms.sl = sliding_log
