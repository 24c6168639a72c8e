-- Token bucket: twin of src/algorithm/token_bucket.rs. Part of the charge,
-- refund and status scripts (see lua/charge.lua for KEYS, ARGV and replies;
-- lua/fixed_window.lua for the functions every algorithm file defines).
--
-- Quota arguments: a rate (see lua/rate.lua): q.a = unit, q.b = per_ms,
-- q.c = capacity.
-- Hash fields: <prefix>l = tokens held, in fine units; <prefix>t = the Unix ms
-- that level was computed at. An absent bucket is full.
-- Reply block: {level, at} as stored ({capacity, now} when absent).
local token_bucket = {suffixes = {'l', 't'}}

-- The effective time (never before the last update) and backlog at `now`.
local function tb_backlog(q, l, t, now)
  local at = math.max(now, t)
  return at, q.c - math.min(q.c, l + (at - t) * q.b)
end

function token_bucket.read(q, v, now)
  local l, t = tonumber(v[q.first]), tonumber(v[q.first + 1])
  if l == nil or t == nil then
    l = q.c
    t = now
  end
  local at, d = tb_backlog(q, l, t, now)
  return {at = at, d = d, l = l, t = t}
end

function token_bucket.fits(q, st, cost)
  return rate_fits(q, st.d, cost)
end

function token_bucket.reply(q, st, cost, out)
  local n = #out
  out[n + 1] = st.l
  out[n + 2] = st.t
end

function token_bucket.write(q, st, cost, now, set)
  local after = add_capped(st.d, cost * q.a)
  local n = #set
  set[n + 1] = q.f.l
  set[n + 2] = q.c - after
  set[n + 3] = q.f.t
  set[n + 4] = st.at
  return st.at + ceil_div(after, q.b), true
end

-- One request's decision on `v` = {level, at} as stored (see
-- fixed_window.step): if admitted, leaves the new level and time in v and
-- returns true and the key's new expiry.
function token_bucket.step(q, v, now, cost, out)
  local l, t = tonumber(v[1]), tonumber(v[2])
  if l == nil or t == nil then
    l = q.c
    t = now
  end
  local at, d = tb_backlog(q, l, t, now)
  local allowed = rate_fits(q, d, cost)
  local n = #out
  out[n + 1] = 4
  out[n + 2] = allowed and 1 or 0
  out[n + 3] = now
  out[n + 4] = l
  out[n + 5] = t
  if not allowed then return false end
  local after = d + cost * q.a
  v[1], v[2] = q.c - after, at
  return true, math.max(at + ceil_div(after, q.b), now) + 1000
end

-- Gives back the part of the charge not refilled yet, only while that charge
-- is the bucket's last change (it would still be full again at `id`).
function token_bucket.refund(q, v, id, now, cost, set)
  local l, t = tonumber(v[q.first]), tonumber(v[q.first + 1])
  if l == nil or t == nil or t + ceil_div(q.c - math.min(q.c, l), q.b) ~= id then return end
  local at, d = tb_backlog(q, l, t, now)
  local give = rate_refundable(q, d, cost)
  if give > 0 then
    push(set, q.f.l, q.c - (d - give), q.f.t, at)
  end
end

-- Debt: `extra` more tokens, below zero if need be (an absent bucket is a
-- full one). The caller checked the charge's window (src/algorithm/mod.rs).
function token_bucket.debit(q, v, now, extra, set)
  local st = token_bucket.read(q, v, now)
  local after = rate_after(q, st.d, extra)
  push(set, q.f.l, q.c - after, q.f.t, st.at)
  return st.at + ceil_div(after, q.b)
end

algorithms.tb = token_bucket
