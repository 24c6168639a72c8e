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
local sliding_window = {suffixes = {'s', 'c', 'p'}}

function sliding_window.read(q, v, now)
  local i = q.first
  local s, c, p = tonumber(v[i]), tonumber(v[i + 1]), tonumber(v[i + 2])
  local start = now - math.fmod(now, q.b)
  local fresh = false
  if s == nil or c == nil or p == nil then
    s, c, p = start, 0, 0
    fresh = true
  end
  local st = {rs = s, rc = c, rp = p}
  -- Roll forward; a window starting after `now` (a clock behind) stays current.
  if s < start then
    if s + q.b == start then p = c else p = 0 end
    c = 0
    s = start
    fresh = true
  end
  local elapsed = math.max(now - s, 0)
  st.s, st.c, st.p, st.fresh = s, c, p, fresh
  st.used = p * (q.b - elapsed) + c * q.b
  return st
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
    push(set, q.f.s, st.s, q.f.c, st.c + cost, q.f.p, st.p)
  else
    push(set, q.f.c, st.c + cost)
  end
  return st.s + 2 * q.b, st.fresh
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

algorithms.sw = sliding_window
