-- Shared arithmetic of the token bucket and GCRA: twin of src/algorithm/rate.rs.
-- Part of the charge, refund and status scripts (see lua/charge.lua); defines
-- local helpers only.
--
-- A rate quota q carries q.a = unit (fine units per token), q.b = per_ms
-- (fine units refilled per ms), q.c = capacity (burst * unit). Every value
-- stays below 2^53, so doubles are exact; math.fmod is exact too.

-- ceil(x / y) for non-negative integers, exactly.
local function ceil_div(x, y)
  local r = math.fmod(x, y)
  return (x - r) / y + (r > 0 and 1 or 0)
end

-- The backlog after charging `cost` more to `d`: past the capacity (debt)
-- only up to one full bucket below empty, so a settlement's debt is bounded
-- (twin of Rate::after in src/algorithm/rate.rs).
local function rate_after(q, d, cost)
  return math.min(d + cost * q.a, math.max(d, 2 * q.c))
end

-- Whether `cost` fits a backlog of `d` fine units (a cost above the burst
-- never does: cost * unit > capacity).
local function rate_fits(q, d, cost)
  return d + cost * q.a <= q.c
end

-- Fine units a refund gives back to a backlog `d`: the charge, never more
-- than the backlog. Only for the charge that made the stored state (see
-- Rate::refundable in src/algorithm/rate.rs).
local function rate_refundable(q, d, cost)
  return math.min(d, cost * q.a, q.c)
end
