-- GCRA: twin of src/algorithm/gcra.rs. Part of the charge, refund and status
-- scripts (see lua/charge.lua for KEYS, ARGV and replies; lua/fixed_window.lua
-- for the functions every algorithm file defines).
--
-- Quota arguments: a rate (see lua/rate.lua): q.a = unit, q.b = per_ms,
-- q.c = capacity.
-- Hash fields: the theoretical arrival time <prefix>t (whole Unix ms) plus
-- <prefix>f / per_ms of a ms. A TAT in the past is a full bucket.
-- Reply block: {tat, fraction} as stored ({now, 0} when absent).
local gcra = {suffixes = {'t', 'f'}}

local function gcra_backlog(q, tat, f, now)
  if tat < now then return 0 end
  return (tat - now) * q.b + math.min(f, q.b - 1)
end

function gcra.read(q, v, now)
  local tat, f = tonumber(v[q.first]), tonumber(v[q.first + 1])
  if tat == nil or f == nil then
    tat = now
    f = 0
  end
  return {d = gcra_backlog(q, tat, f, now), tat = tat, f = f}
end

function gcra.fits(q, st, cost)
  return rate_fits(q, st.d, cost)
end

function gcra.reply(q, st, cost, out)
  local n = #out
  out[n + 1] = st.tat
  out[n + 2] = st.f
end

-- Stores the TAT `after` fine units past `now`; returns when it is reached.
local function gcra_set(q, now, after, set)
  local f = math.fmod(after, q.b)
  local tat = now + (after - f) / q.b
  local n = #set
  set[n + 1] = q.f.t
  set[n + 2] = tat
  set[n + 3] = q.f.f
  set[n + 4] = f
  return tat + (f > 0 and 1 or 0)
end

function gcra.write(q, st, cost, now, set)
  return gcra_set(q, now, add_capped(st.d, cost * q.a), set), true
end

-- One request's decision on `v` = {tat, fraction} as stored (see
-- fixed_window.step): if admitted, leaves the new TAT and fraction in v and
-- returns true and the key's new expiry.
function gcra.step(q, v, now, cost, out)
  local tat, f = tonumber(v[1]), tonumber(v[2])
  if tat == nil or f == nil then
    tat = now
    f = 0
  end
  local d = gcra_backlog(q, tat, f, now)
  local allowed = rate_fits(q, d, cost)
  local n = #out
  out[n + 1] = 4
  out[n + 2] = allowed and 1 or 0
  out[n + 3] = now
  out[n + 4] = tat
  out[n + 5] = f
  if not allowed then return false end
  local after = d + cost * q.a
  local af = math.fmod(after, q.b)
  local at = now + (after - af) / q.b
  v[1], v[2] = at, af
  return true, math.max(at + (af > 0 and 1 or 0), now) + 1000
end

-- Only while the charge is the latest (the TAT is still the one it made):
-- one timestamp cannot tell when later charges happened.
function gcra.refund(q, v, id, now, cost, set)
  local tat, f = tonumber(v[q.first]), tonumber(v[q.first + 1])
  if tat == nil or f == nil or tat + (f > 0 and 1 or 0) ~= id then return end
  local d = gcra_backlog(q, tat, f, now)
  local give = rate_refundable(q, d, cost)
  if give > 0 then
    gcra_set(q, now, d - give, set)
  end
end

-- Debt: the TAT `extra` units later (an absent TAT is a full bucket). The
-- caller checked the charge's window (src/algorithm/mod.rs).
function gcra.debit(q, v, now, extra, set)
  return gcra_set(q, now, rate_after(q, gcra.read(q, v, now).d, extra), set)
end

algorithms.gc = gcra
