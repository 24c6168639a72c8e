-- Sliding window counter: twin of src/algorithm/sliding_window.rs. Part of
-- the charge, refund and status scripts (see lua/charge.lua for KEYS, ARGV
-- and replies; lua/fixed_window.lua for the functions every algorithm file
-- defines).
--
-- Quota arguments: q.a = limit, q.b = window (ms); limit * window <= 2^52.
-- Hash fields: <prefix>s = start of the current window (a multiple of the
-- window, Unix ms), <prefix>c = units in it, <prefix>p = units in the one before.
-- Reply block: {start, current, previous} as stored ({window start, 0, 0}
-- when absent).
local sliding_window = {suffixes = {'s', 'c', 'p'}, count = 2}

-- The most units one window counts, 2^52 / window (at least the limit):
-- debt past it is dropped (twin of `most` in src/algorithm/sliding_window.rs).
local function sw_add(q, n, extra)
  return math.min(n + extra, math.floor(4503599627370496 / q.b))
end

-- The window at `now` from the stored start, current and previous counts
-- (nil = absent): those as stored (a fresh window's when absent), then as
-- rolled forward to `now`, whether the state is new or rolled (its fields
-- and expiry must be written), and the weight used (units x ms).
local function sw_roll(q, s, c, p, now)
  local start = now - math.fmod(now, q.b)
  local fresh = false
  if s == nil or c == nil or p == nil then
    s, c, p = start, 0, 0
    fresh = true
  end
  local rs, rc, rp = s, c, p
  -- Roll forward; a window starting after `now` (a clock behind) stays current.
  if s < start then
    if s + q.b == start then p = c else p = 0 end
    c = 0
    s = start
    fresh = true
  end
  local used = p * (q.b - math.max(now - s, 0)) + c * q.b
  return rs, rc, rp, s, c, p, fresh, used
end

function sliding_window.read(q, v, now)
  local i = q.first
  local rs, rc, rp, s, c, p, fresh, used =
    sw_roll(q, tonumber(v[i]), tonumber(v[i + 1]), tonumber(v[i + 2]), now)
  return {rs = rs, rc = rc, rp = rp, s = s, c = c, p = p, fresh = fresh, used = used}
end

function sliding_window.fits(q, st, cost)
  return cost <= q.a and st.used + cost * q.b <= q.a * q.b
end

function sliding_window.reply(q, st, cost, out)
  local n = #out
  out[n + 1] = st.rs
  out[n + 2] = st.rc
  out[n + 3] = st.rp
end

-- Within a window only the current count changes (and the expiry stays).
function sliding_window.write(q, st, cost, now, set)
  if st.fresh then
    push(set, q.f.s, st.s, q.f.c, sw_add(q, st.c, cost), q.f.p, st.p)
  else
    push(set, q.f.c, sw_add(q, st.c, cost))
  end
  return st.s + 2 * q.b, st.fresh
end

-- One request's decision on `v` = {start, current, previous} as stored
-- (see fixed_window.step): if admitted, leaves the window rolled forward and
-- charged in v and returns true and, if the window is new or rolled (every
-- field changed), the key's new expiry; else only the count changed.
function sliding_window.step(q, v, now, cost, out)
  local rs, rc, rp, s, c, p, fresh, used =
    sw_roll(q, tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), now)
  local allowed = cost <= q.a and used + cost * q.b <= q.a * q.b
  local n = #out
  out[n + 1] = 5
  out[n + 2] = allowed and 1 or 0
  out[n + 3] = now
  out[n + 4] = rs
  out[n + 5] = rc
  out[n + 6] = rp
  if not allowed then return false end
  v[1], v[2], v[3] = s, c + cost, p
  if fresh then
    return true, math.max(s + 2 * q.b, now) + 1000
  end
  return true
end

-- Takes the cost back from the window charged (its start is `id`): the
-- current count, or the previous one if the window moved on once.
function sliding_window.refund(q, v, id, now, cost, set)
  local i = q.first
  local s, c, p = tonumber(v[i]), tonumber(v[i + 1]), tonumber(v[i + 2])
  if s == nil or c == nil or p == nil then return end
  if s == id then
    push(set, q.f.c, math.max(c - cost, 0))
  elseif s == id + q.b then
    push(set, q.f.p, math.max(p - cost, 0))
  end
end

-- Debt goes to the window charged, as a refund: the current count, or the
-- previous one once the window moved on.
function sliding_window.debit(q, v, now, extra, set)
  local i = q.first
  local s, c, p = tonumber(v[i]), tonumber(v[i + 1]), tonumber(v[i + 2])
  if s == nil or c == nil or p == nil then return end
  if s == q.id then
    push(set, q.f.c, sw_add(q, c, extra))
  elseif s == q.id + q.b then
    push(set, q.f.p, sw_add(q, p, extra))
  end
end

algorithms.sw = sliding_window
