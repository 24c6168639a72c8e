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
--                                the key's TTL is already right)
--   refund(q, v, id, now, cost, set)
--   debit(q, v, now, extra, set) -> expiry or nil
--                                charges `extra` more to the state charged
--                                (q.id, at q.at; see `debit` in
--                                src/algorithm/mod.rs); returns the state's
--                                expiry when it may have moved later
-- and may define step(q, v, now, cost, out): one request's decision for a
-- policy of that one quota, on its own fields v[1..], faster (see
-- fixed_window.step below and lua/charge.lua), with `count`, the index of
-- the field a charge alone changes when step returns no expiry.
--
-- Quota arguments: q.a = limit, q.b = window (ms).
-- Hash fields: <prefix>c = units charged in the window, <prefix>r = the
-- window's stored reset (Unix ms). A window whose reset has passed is
-- discarded, whatever TTL the key still has (replicas, clock skew).
-- Reply block: {count, reset} as read, a stale window replaced by a fresh one.
local fixed_window = {suffixes = {'c', 'r'}, count = 1}

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
  set[n + 2] = add_capped(st.c, cost)
  if st.fresh then
    set[n + 3] = q.f.r
    set[n + 4] = st.r
  end
  return st.r, st.fresh
end

-- One request's decision for a policy of this quota alone (see
-- lua/charge.lua: a lone request, or each request of a run for one key), on
-- `v`, the count and reset as stored (HMGET values, or numbers the run left
-- there), with no table per request: the same read, decision, reply and
-- writes as read/fits/reply/write above. Appends the request's reply (its
-- length, allowed, now, count, reset) to `out`, and if admitted leaves the
-- new count in v[1] (and a new window's reset in v[2]). Returns whether it
-- was admitted and, if it opened a window (every field changed), the key's
-- new expiry; else only the count (field `count`) changed.
function fixed_window.step(q, v, now, cost, out)
  local c, r = tonumber(v[1]), tonumber(v[2])
  local fresh = c == nil or r == nil or r <= now
  if fresh then
    c, r = 0, now + q.b
  else
    -- The same state, kept as numbers: the run's next request reads them
    -- without strtod (about 1,000 instructions for a 13-digit reset).
    v[1], v[2] = c, r
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

-- Debt reaches only the window charged, while it lasts; the count may pass
-- the limit.
function fixed_window.debit(q, v, now, extra, set)
  local c, r = tonumber(v[q.first]), tonumber(v[q.first + 1])
  if c ~= nil and r ~= nil and r == q.id and r > now then
    push(set, q.f.c, add_capped(c, extra))
  end
end

algorithms.fw = fixed_window
