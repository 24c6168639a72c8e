-- Fixed window: twin of src/algorithm/fixed_window.rs. Part of the charge,
-- refund and status scripts (see lua/charge.lua for KEYS, ARGV and replies).
--
-- Every algorithm file defines the same functions, on `v`, a policy's HMGET
-- values, where this quota's fields start at v[q.first]:
--   read(q, v, now) -> st        the state at `now`
--   fits(q, st, cost) -> bool    whether `cost` is admitted
--   reply(q, st, cost, out)      appends the reply block to `out`
--   write(q, st, cost, now, set) appends the changed fields and values of an
--                                admitted charge to `set`; returns the state's
--                                expiry and whether it may have moved (else
--                                the key's PEXPIREAT is already right)
--   refund(q, v, id, now, cost, set)
-- and may define step(q, v, now, cost, out), one request's decision on a
-- lone quota's own fields v[1..] (see fixed_window.step below; a run of
-- requests for one key steps through them, lua/charge.lua's charge_run), and
-- alone(q, hash, now, cost, out, cost_arg): the whole charge of a policy of
-- that one quota, faster (see lua/charge.lua; cost_arg is the cost as sent,
-- a decimal string).
--
-- Quota arguments: q.a = limit, q.b = window (ms).
-- Hash fields: <prefix>c = units charged in the window, <prefix>r = the
-- window's stored reset (Unix ms). A window whose reset has passed is
-- discarded, whatever TTL the key still has (replicas, clock skew).
-- Reply block: {count, reset} as read, a stale window replaced by a fresh one.
local fixed_window = {suffixes = {'c', 'r'}}

function fixed_window.read(q, v, now)
  local c, r = tonumber(v[q.first]), tonumber(v[q.first + 1])
  if c == nil or r == nil or r <= now then
    return {c = 0, r = now + q.b, fresh = true}
  end
  return {c = c, r = r}
end

function fixed_window.fits(q, st, cost)
  return cost <= q.a and st.c + cost <= q.a
end

function fixed_window.reply(q, st, cost, out)
  local n = #out
  out[n + 1] = st.c
  out[n + 2] = st.r
end

-- Within a window only the count changes; a new window also stores its
-- reset, and moves the key's expiry (the charge that opened the window set
-- it for the rest of it).
function fixed_window.write(q, st, cost, now, set)
  local n = #set
  set[n + 1] = q.f.c
  set[n + 2] = st.c + cost
  if st.fresh then
    set[n + 3] = q.f.r
    set[n + 4] = st.r
  end
  return st.r, st.fresh
end

-- The whole charge of a policy of this quota alone (the common case), with
-- no intermediate tables: the same read, decision, reply and writes as
-- read/fits/reply/write above and lua/charge.lua's charge_one. Appends the
-- request's reply (its length, allowed, now, count, reset) to `out`.
function fixed_window.alone(q, hash, now, cost, out, cost_arg)
  local v = redis.call('HMGET', hash, q.f.c, q.f.r)
  local c, r = tonumber(v[1]), tonumber(v[2])
  local fresh = c == nil or r == nil or r <= now
  if fresh then
    c, r = 0, now + q.b
  end
  local allowed = cost <= q.a and c + cost <= q.a
  local n = #out
  out[n + 1] = 4
  out[n + 2] = allowed and 1 or 0
  out[n + 3] = now
  out[n + 4] = c
  out[n + 5] = r
  if allowed then
    if fresh then
      redis.call('HSET', hash, q.f.c, c + cost, q.f.r, r)
      redis.call('PEXPIREAT', hash, r + 1000)
    else
      -- The same write as HSET c + cost, without turning a Lua number back
      -- into a string (snprintf): the stored count is an integer we wrote.
      redis.call('HINCRBY', hash, q.f.c, cost_arg)
    end
  end
end

-- A run of requests for one key under a policy of this quota alone (see
-- lua/charge.lua's charge_run; each algorithm's step is the same decision as
-- its alone, kept apart because a Lua call per request would cost a lone
-- charge about 2%: the runs and property tests pin both to read/fits/reply/
-- write): `v` holds the count and reset as stored,
-- and each request is decided on them as the one before it left them, with
-- no table per request. Appends the request's reply to `out` and returns
-- whether it wrote: the count (v[1]) changed, and, if it opened a window,
-- the key's new expiry (the reset, v[2], changed too; else nil).
function fixed_window.step(q, v, now, cost, out)
  local c, r = tonumber(v[1]), tonumber(v[2])
  local fresh = c == nil or r == nil or r <= now
  if fresh then
    c, r = 0, now + q.b
  end
  local allowed = cost <= q.a and c + cost <= q.a
  local n = #out
  out[n + 1] = 4
  out[n + 2] = allowed and 1 or 0
  out[n + 3] = now
  out[n + 4] = c
  out[n + 5] = r
  if not allowed then return false end
  v[1] = c + cost
  if fresh then
    v[2] = r
    return true, r + 1000
  end
  return true
end

-- A refund reaches only the window charged (its reset is `id`), never below zero.
function fixed_window.refund(q, v, id, now, cost, set)
  local c, r = tonumber(v[q.first]), tonumber(v[q.first + 1])
  if c ~= nil and r ~= nil and r == id and r > now then
    push(set, q.f.c, math.max(c - cost, 0))
  end
end

algorithms.fw = fixed_window
