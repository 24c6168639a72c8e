-- Sliding window counter: twin of src/algorithm/sliding_window.rs. Part of
-- the charge, refund and status scripts (see lua/charge.lua for KEYS, ARGV
-- and replies).
--
-- Quota arguments: q.a = limit, q.b = window (ms); limit * window <= 2^52.
-- Hash fields: <prefix>s = start of the current window (a multiple of the
-- window, Unix ms), <prefix>c = units in it, <prefix>p = units in the one before.
-- Reply block: {start, current, previous} as stored ({window start, 0, 0}
-- when absent).
local sliding_window = {suffixes = {'s', 'c', 'p'}}

function sliding_window.read(q, v, now)
  local s, c, p = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  local start = now - math.fmod(now, q.b)
  if s == nil or c == nil or p == nil then
    s, c, p = start, 0, 0
  end
  local reply = {s, c, p}
  -- Roll forward; a window starting after `now` (a clock behind) stays current.
  if s < start then
    if s + q.b == start then p = c else p = 0 end
    c = 0
    s = start
  end
  local elapsed = math.max(now - s, 0)
  return {s = s, c = c, used = p * (q.b - elapsed) + c * q.b, p = p, reply = reply}
end

function sliding_window.fits(q, st, cost)
  return cost <= q.a and st.used + cost * q.b <= q.a * q.b
end

function sliding_window.write(q, st, cost, now, set)
  push(set, q.f.s, st.s, q.f.c, st.c + cost, q.f.p, st.p)
  return st.s + 2 * q.b
end

-- Takes the cost back from the window charged (its start is `id`): the
-- current count, or the previous one if the window moved on once.
function sliding_window.refund(q, v, id, now, cost, set)
  local s, c, p = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  if s == nil or c == nil or p == nil then return end
  if s == id then
    push(set, q.f.c, math.max(c - cost, 0))
  elseif s == id + q.b then
    push(set, q.f.p, math.max(p - cost, 0))
  end
end
