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
-- Reply block: {live total, newest entry ms (0: none), k, t_1, c_1, .., t_k, c_k}:
-- the k oldest live entries, only when this quota rejects (k = 0 otherwise),
-- as many as the retry computation needs.
local sliding_log = {suffixes = {'n'}, log = true}

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

-- Appends the reply block; on a rejection by this quota, the oldest live
-- entries until enough of them would have slid out to admit `cost`.
function sliding_log.reply(q, st, cost, out)
  push(out, st.total, st.newest or 0)
  local k_at = #out + 1
  out[k_at] = 0
  if sliding_log.fits(q, st, cost) or cost > q.a then return end
  local need = st.total + cost - q.a
  local freed, k, offset = 0, 0, 0
  while freed < need do
    local batch = redis.call('ZRANGEBYSCORE', q.key, '(' .. string.format('%d', st.cutoff), '+inf',
      'WITHSCORES', 'LIMIT', offset, 64)
    if #batch == 0 then break end
    for j = 1, #batch, 2 do
      local c = entry_cost(batch[j])
      push(out, tonumber(batch[j + 1]), c)
      k = k + 1
      freed = freed + c
      if freed >= need then break end
    end
    offset = offset + 64
  end
  out[k_at] = k
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
