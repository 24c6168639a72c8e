-- Reading a policy's quotas from ARGV; assembled after the algorithm files,
-- before the script's own file (see lua/prelude.lua).

local algorithms = {
  fw = fixed_window,
  tb = token_bucket,
  sw = sliding_window,
  gc = gcra,
  sl = sliding_log,
}

-- The quotas from ARGV[4..], `stride` arguments each (a 6th is a window id);
-- sliding logs take their keys from KEYS[2..] in order.
local function parse_quotas(stride)
  local quotas = {}
  local next_key = 2
  for i = 1, tonumber(ARGV[3]) do
    local base = 3 + stride * (i - 1)
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
      id = tonumber(ARGV[base + 6]),
    }
    if alg.log then
      q.key = KEYS[next_key]
      next_key = next_key + 1
    end
    quotas[i] = q
  end
  return quotas
end

-- Every quota's hash fields, in order, for one HMGET; notes where each starts.
local function quota_fields(quotas)
  local fields = {}
  for _, q in ipairs(quotas) do
    q.first = #fields + 1
    for _, s in ipairs(q.alg.suffixes) do
      fields[#fields + 1] = q.p .. s
    end
  end
  return fields
end

-- The HMGET values of quota q's fields.
local function quota_vals(q, vals)
  local v = {}
  for i = 1, #q.alg.suffixes do
    v[i] = vals[q.first + i - 1]
  end
  return v
end
