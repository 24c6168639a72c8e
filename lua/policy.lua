-- Reading a policy's quotas from ARGV; assembled after the algorithm files,
-- before the script's own file (see lua/prelude.lua).

-- The policy at ARGV[at]: its number of quotas n, then `stride` arguments
-- per quota: algorithm code, field prefix (algorithm and window, e.g.
-- "tb60000"), a, b, c (see each algorithm's file), m (how it is asked: 0
-- counts requests, 1 admits while anything is left, 2 while the
-- reservation fits; see `ask` in lua/prelude.lua) and, with a stride of 10,
-- a settlement: the window id charged, when, what was charged and what the
-- request cost. A policy that waits or keeps a penalty box sends -n
-- instead of n, and after its quotas 6 refusal settings: whether it waits
-- (1/0), its penalty box's field prefix ("" for none), the refusals that
-- block, the span they are counted over, the block (ms) and whether a
-- blocked request starts the block again (1/0) (see lua/refusal.lua).
-- Returns the quotas, the index after the policy and its refusal settings
-- (nil for a plain policy).
-- Each quota carries q.f, its hash field names by suffix (q.f.c = prefix .. "c").
local function parse_quotas(at, stride)
  local quotas = {}
  local n = tonumber(ARGV[at])
  local plain = n >= 0
  if not plain then n = -n end
  for i = 1, n do
    local base = at + stride * (i - 1)
    local alg = algorithms[ARGV[base + 1]]
    if alg == nil then
      error('unknown rate-limit algorithm ' .. tostring(ARGV[base + 1]))
    end
    local q = {
      alg = alg,
      p = ARGV[base + 2],
      a = tonumber(ARGV[base + 3]),
      b = tonumber(ARGV[base + 4]),
      c = tonumber(ARGV[base + 5]),
      m = tonumber(ARGV[base + 6]),
      f = {},
    }
    if stride == 10 then
      q.id = tonumber(ARGV[base + 7])
      q.at = tonumber(ARGV[base + 8])
      q.reserved = tonumber(ARGV[base + 9])
      q.actual = tonumber(ARGV[base + 10])
    end
    for _, s in ipairs(alg.suffixes) do
      q.f[s] = q.p .. s
    end
    quotas[i] = q
  end
  local next = at + 1 + stride * n
  if plain then return quotas, next end
  local r = {
    wait = ARGV[next] == '1',
    pfx = ARGV[next + 1] ~= '' and ARGV[next + 1] or nil,
    after = tonumber(ARGV[next + 2]),
    within = tonumber(ARGV[next + 3]),
    block = tonumber(ARGV[next + 4]),
    extend = ARGV[next + 5] == '1',
  }
  return quotas, next + 6, r
end

-- Every quota's hash fields, in order, for one HMGET; notes where each starts.
local function quota_fields(quotas)
  local fields = {}
  for _, q in ipairs(quotas) do
    q.first = #fields + 1
    for _, s in ipairs(q.alg.suffixes) do
      fields[#fields + 1] = q.f[s]
    end
  end
  return fields
end

-- Gives each sliding-log quota its sorted set, KEYS[k], KEYS[k + 1], ... in
-- policy order; returns the index of the next key.
local function bind_logs(quotas, k)
  for _, q in ipairs(quotas) do
    if q.alg.log then
      q.key = KEYS[k]
      k = k + 1
    end
  end
  return k
end
