-- Fixed window: twin of src/algorithm/fixed_window.rs. Part of the charge,
-- refund and status scripts (see lua/charge.lua for KEYS, ARGV and replies).
--
-- Quota arguments: q.a = limit, q.b = window (ms).
-- Hash fields: <prefix>c = units charged in the window, <prefix>r = the
-- window's stored reset (Unix ms). A window whose reset has passed is
-- discarded, whatever TTL the key still has (replicas, clock skew).
-- Reply block: {count, reset} as read, a stale window replaced by a fresh one.
local fixed_window = {suffixes = {'c', 'r'}}

function fixed_window.read(q, v, now)
  local c, r = tonumber(v[1]), tonumber(v[2])
  if c == nil or r == nil or r <= now then
    c = 0
    r = now + q.b
  end
  return {c = c, r = r, reply = {c, r}}
end

function fixed_window.fits(q, st, cost)
  return cost <= q.a and st.c + cost <= q.a
end

-- Appends the fields of an admitted charge to `set`; returns the state's expiry.
function fixed_window.write(q, st, cost, now, set)
  push(set, q.f.c, st.c + cost, q.f.r, st.r)
  return st.r
end

-- A refund reaches only the window charged (its reset is `id`), never below zero.
function fixed_window.refund(q, v, id, now, cost, set)
  local c, r = tonumber(v[1]), tonumber(v[2])
  if c ~= nil and r ~= nil and r == id and r > now then
    push(set, q.f.c, math.max(c - cost, 0))
  end
end
