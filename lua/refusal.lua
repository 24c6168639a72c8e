-- Waiting for a turn and the penalty box: twin of src/algorithm/refusal.rs,
-- src/algorithm/penalty.rs and the bookings and holes of
-- src/algorithm/gcra.rs. Part of the charge script when its batch has a
-- policy that waits or keeps a penalty box (src/store/redis/scripts.rs),
-- and of the settle and status scripts; after lua/policy.lua, whose
-- parse_quotas reads a policy's refusal settings `r`.
--
-- Hash fields, in the client's hash beside its quotas':
--   <quota prefix>h   a GCRA quota of a policy that waits: its holes,
--                     "end:units" pairs joined by "," (see Holes in
--                     src/algorithm/gcra.rs), at most 64
--   <r.pfx>n, s, b    a policy's penalty box: the refusals counted, when
--                     the count started and until when the key is blocked
--                     (Unix ms); r.pfx is "p" and the policy's fingerprint,
--                     so each policy of a key has its own box
local refusal = {}

-- Adds the fields of the policy's refusal settings to `fields` (the
-- quotas' fields, as quota_fields made them) and notes where they are.
function refusal.fields(quotas, r, fields)
  if r.wait then
    for _, q in ipairs(quotas) do
      q.fh = q.p .. 'h'
      q.hi = #fields + 1
      fields[#fields + 1] = q.fh
    end
  end
  if r.pfx then
    r.first = #fields + 1
    r.fn, r.fs, r.fb = r.pfx .. 'n', r.pfx .. 's', r.pfx .. 'b'
    push(fields, r.fn, r.fs, r.fb)
  end
end

-- The holes stored in `s` (false: none) that end after `now`, as
-- {end, units} pairs: the others have refilled.
local function holes_read(s, now)
  local list = {}
  if s then
    for e, u in string.gmatch(s, '(%d+):(%d+)') do
      e = tonumber(e)
      if e > now then list[#list + 1] = {e, tonumber(u)} end
    end
  end
  return list
end

-- Adds a hole: to the one ending on the same ms, or as a new one, making
-- room by dropping the one that ends first (Holes::add).
local function holes_add(list, e, u)
  for _, h in ipairs(list) do
    if h[1] == e then
      h[2] = h[2] + u
      return
    end
  end
  if #list >= 64 then
    local first = 1
    for i = 2, #list do
      if list[i][1] < list[first][1] then first = i end
    end
    table.remove(list, first)
  end
  list[#list + 1] = {e, u}
end

-- Takes the hole ending at `e`: its units, or nil.
local function holes_take(list, e)
  for i, h in ipairs(list) do
    if h[1] == e then
      table.remove(list, i)
      return h[2]
    end
  end
end

-- Appends quota q's holes to `set` when there are any or were any.
local function holes_write(q, stored, list, set)
  if (stored and stored ~= '') or #list > 0 then
    local parts = {}
    for i, h in ipairs(list) do parts[i] = h[1] .. ':' .. h[2] end
    push(set, q.fh, table.concat(parts, ','))
  end
end

-- The penalty box as stored: refusals, since, until (0, 0, 0: none).
local function penalty_read(r, v)
  return tonumber(v[r.first]) or 0, tonumber(v[r.first + 1]) or 0, tonumber(v[r.first + 2]) or 0
end

-- After a refusal at `now` of a key not blocked (penalty::State::refused):
-- the box to store.
local function penalty_refused(r, n, s, b, now)
  if n == 0 or now >= s + r.within then
    n, s = 0, now
  end
  n = n + 1
  if n < r.after then return n, s, b end
  return 0, s, now + r.block
end

-- Books a request of `cost` that does not fit now for its turn, if it comes
-- within `wait` ms (refusal::after_refusal, gcra::book): the common turn of
-- every quota (all GCRA, each read into q.st by decide), each quota charged
-- from that turn, or from when its backlog has refilled if later, and the
-- gap before the turn kept as a hole. Appends the writes to `set`; returns
-- the turn and the latest expiry, or nil.
local function book(quotas, vals, now, cost, wait, set)
  local t = 0
  for _, q in ipairs(quotas) do
    if cost * q.a > q.c then return nil end
    local over = q.st.d + cost * q.a - q.c
    if over > 0 then t = math.max(t, ceil_div(over, q.b)) end
  end
  if t > wait then return nil end
  local latest = 0
  for _, q in ipairs(quotas) do
    local d = q.st.d
    local start = math.max(d, t * q.b)
    latest = math.max(latest, gcra_set(q, now, start + cost * q.a, set))
    -- A quota whose backlog is empty has no holes left to reclaim.
    local list = d > 0 and holes_read(vals[q.hi], now) or {}
    if start > d then holes_add(list, now + t, start - d) end
    holes_write(q, vals[q.hi], list, set)
  end
  return t, latest
end

-- Charges one request of a policy that waits or keeps a penalty box (pol,
-- its refusal settings pol.refusal) on the client's hash, with one HMGET:
-- a key in its penalty box is refused at once, writing nothing unless a
-- blocked request starts the block again; otherwise the request is decided
-- as charge_one does (`decide` and `writes`, lua/charge.lua); a refusal is
-- booked for its turn when it may wait, else counted in the penalty box.
-- `arg4` is the request's fourth argument: its wait budget in ms for a
-- policy that waits (whose quotas all count requests), else its
-- reservation. Its reply: as charge_one's, then the turn (a policy that
-- waits; 0 unless booked) and the penalty box as read (n, s, b; a policy
-- that keeps one). The key's TTL covers the penalty box as it is left.
function refusal.charge(hash, pol, now, cost, arg4, out, decide, writes)
  local quotas, r = pol.quotas, pol.refusal
  local vals = redis.call('HMGET', hash, unpack(pol.fields))
  local units, wait = tonumber(arg4), 0
  if r.wait then units, wait = cost, units end
  local start = #out + 1
  local admitted = decide(quotas, vals, now, cost, units, out)
  local n, s, b = 0, 0, 0
  if r.pfx then n, s, b = penalty_read(r, vals) end
  -- Writes, the quotas' new TTL (nil: unchanged), the turn, and the
  -- penalty box as left (nil: unchanged).
  local set, ttl, t = {}, nil, 0
  local box = nil
  if r.pfx and b > now then
    out[start + 1] = 0
    if r.extend then
      box = {n, s, now + r.block}
      push(set, r.fb, box[3])
    end
  elseif admitted then
    set, ttl = writes(quotas, now)
  else
    local turn, latest = nil, nil
    if wait > 0 then turn, latest = book(quotas, vals, now, cost, wait, set) end
    if turn then
      t = turn
      out[start + 1] = 1
      ttl = math.max(latest - now, 0) + 1000
    elseif r.pfx then
      box = {penalty_refused(r, n, s, b, now)}
      push(set, r.fn, box[1], r.fs, box[2], r.fb, box[3])
    end
  end
  if r.wait then out[#out + 1] = t end
  if r.pfx then push(out, n, s, b) end
  out[start] = #out - start
  if #set > 0 then redis.call('HSET', hash, unpack(set)) end
  -- The penalty box lives until its block has ended and its count's span
  -- has passed (penalty::State::expires_at), plus the second every key keeps.
  local life = nil
  if r.pfx then
    local left = box or {n, s, b}
    local e = math.max(left[3], left[2] + r.within)
    if e > now then life = e - now + 1000 end
  end
  if ttl then
    redis.call('PEXPIRE', hash, math.max(ttl, life or 0))
  elseif box and life and redis.call('PTTL', hash) < life then
    redis.call('PEXPIRE', hash, life)
  end
end

-- A refund for a policy that waits, whose bookings are given back in any
-- order (gcra::refund_holed): the last charge moves the TAT back by its
-- unspent part, then by each hole ending where the TAT lands; an earlier
-- charge still ahead leaves a hole. Appends the writes to `set`.
function refusal.refund(q, v, id, now, cost, set)
  local tat, f = tonumber(v[q.first]), tonumber(v[q.first + 1])
  local stored = v[q.hi]
  local d = 0
  if tat ~= nil and f ~= nil then d = gcra_backlog(q, tat, f, now) end
  local list = {}
  if d > 0 then
    list = holes_read(stored, now)
    if tat + (f > 0 and 1 or 0) ~= id then
      if id > now and cost > 0 then holes_add(list, id, math.min(cost * q.a, q.c)) end
    else
      local left = d - rate_refundable(q, d, cost)
      while left > 0 do
        local u = holes_take(list, now + ceil_div(left, q.b))
        if u == nil then break end
        left = math.max(left - u, 0)
      end
      if left == 0 then list = {} end
      if left < d then gcra_set(q, now, left, set) end
    end
  end
  holes_write(q, stored, list, set)
end
