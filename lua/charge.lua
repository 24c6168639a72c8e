-- Charge: a batch of requests, each charged every quota of its policy, all
-- or nothing, whatever their algorithms, in order (two requests for one key
-- see each other's charges). Concurrent requests travel together in one call
-- (src/store/redis/batch.rs); an idle service sends batches of one.
-- Assembled after lua/prelude.lua, lua/rate.lua, the algorithm files,
-- lua/policy.lua and, when the batch has a policy that waits or keeps a
-- penalty box, lua/refusal.lua (src/store/redis/scripts.rs); the shared
-- vectors in tests/ keep each algorithm equal to its twin in src/algorithm/.
--
-- ARGV[1]  P, the number of distinct policies in the batch; then each policy
--          as lua/policy.lua reads it (n, then 6 arguments per quota; -n,
--          the quotas and 6 refusal settings for a policy that waits or
--          keeps a penalty box)
-- then     J, the number of requests; then 4 arguments per request: its
--          policy (1..P, or 0: the same key and policy as the request before
--          it, which it continues a run of; see charge_run), now (Unix ms
--          from the application's clock; "" = Redis TIME), its cost (units
--          charged to each quota counting requests) and its reservation
--          (units charged to each quota of another unit; see `ask`) or,
--          for a policy that waits (whose quotas all count requests), how
--          far ahead it may be booked (ms; 0: not at all)
-- KEYS     per request that does not continue a run, in order: the client's
--          hash (prefix .. "{" .. tag .. "}", all scalar state), then one
--          sorted set per sliding-log quota of its policy, in policy order
--          (the hash's key .. ":" .. field prefix: same {tag}, same slot)
--
-- Per request: reads every quota's fields with one HMGET, decides, and only
-- if every quota admits the cost writes the fields that changed with one
-- HSET (and the logs), then sets the key's TTL (PEXPIRE) to one second
-- after the latest expiry when it may have moved (a fixed window's expiry is
-- set by the charge that opens it). Every TTL is relative to the `now` the
-- script was given, never an absolute time judged by Redis's clock: an
-- application clock behind Redis's would otherwise set an expiry already
-- past, and the state would be deleted by the script that writes it. A rejection writes nothing. A policy of one quota of any
-- algorithm but the sliding log does the same through its algorithm's
-- `step`, with no intermediate tables (the common case, and about 20-30%
-- less Redis CPU; scripts/script_cost.sh counts it), adding a count that
-- alone changed with HINCRBY. Requests in a
-- row for one key and policy without logs (the application marks them) are
-- one run: one HMGET, one HSET and at most one PEXPIRE for all of them
-- (charge_run; 43-58% less Redis CPU per decision for a hot key). A
-- policy that waits or keeps a penalty box is charged one request at a
-- time by refusal.charge (lua/refusal.lua), never by a step or a run.
--
-- Returns, per request in order, k and then k numbers {allowed (1/0), now,
-- block_1, ..., block_n}: each quota's state as read, before this request's
-- charge (block layouts in the algorithm files), from which the application
-- derives every header (a policy that waits or keeps a penalty box appends
-- its turn and its penalty box as read: see refusal.charge); or -1 when
-- that request alone failed (e.g. its key
-- holds another type), the other requests of the batch being unaffected.
-- The numbers are packed as 8-byte little-endian integers into one string,
-- the reply's first element: one bulk string, which the application reads
-- without a general reply parser (with one RESP value per number, parsing
-- the reply cost the application more than the rest of the charge). The
-- message of each failed request follows, in order.

-- Decides one request on `vals`, its policy's fields as HMGET returns them,
-- and appends its reply to `out`: its length, then allowed, now and each
-- quota's block. Returns whether every quota admits the cost.
local function decide(quotas, vals, now, cost, units, out)
  local allowed = 1
  for i = 1, #quotas do
    local q = quotas[i]
    q.st = q.alg.read(q, vals, now)
    q.fit, q.charge = ask(q, cost, units)
    if not q.alg.fits(q, q.st, q.fit) then allowed = 0 end
  end

  -- Length and decision are filled in at the end (no holes: # must stay exact).
  local start = #out + 1
  out[start] = 0
  out[start + 1] = 0
  out[start + 2] = now
  for i = 1, #quotas do
    local q = quotas[i]
    q.alg.reply(q, q.st, q.fit, out)
  end
  out[start] = #out - start
  out[start + 1] = allowed
  return allowed == 1
end

-- The fields and values an admitted charge changes (each quota its
-- q.charge, set by decide), as HSET takes them, and the key's new TTL (ms
-- from `now`) if its expiry may have moved (else nil).
local function writes(quotas, now)
  local set = {}
  local latest, moved = 0, false
  for i = 1, #quotas do
    local q = quotas[i]
    local e, m = q.alg.write(q, q.st, q.charge, now, set)
    if e > latest then latest = e end
    moved = moved or m
  end
  return set, moved and math.max(latest - now, 0) + 1000 or nil
end

-- Charges one request: reads its fields with one HMGET, decides, and if
-- admitted writes what changed with one HSET (and PEXPIRE if it moved).
local function charge_one(hash, quotas, fields, now, cost, units, out)
  local vals = redis.call('HMGET', hash, unpack(fields))
  if decide(quotas, vals, now, cost, units, out) then
    local set, ttl = writes(quotas, now)
    redis.call('HSET', hash, unpack(set))
    if ttl then redis.call('PEXPIRE', hash, ttl) end
  end
end

-- A run of requests in a row for one key under one policy without logs (a
-- hot client, a global limit; the application marks them, policy 0): one HMGET, then each request decided on the
-- fields as the requests before it in the run left them, then one HSET of
-- the fields that changed and the PEXPIRE the last one to move the expiry
-- set. The same replies and the same final state as charging them one by
-- one (numbers are integers below 2^53, stored and read back exactly), with
-- three Redis calls for the run instead of two or three per request. If the
-- HSET fails (say OOM), the whole run fails: nothing of it was written.
-- (`args`: where the requests' arguments start, ARGV[args] = J.)
local function charge_run(hash, pol, first, last, args, out)
  local vals = redis.call('HMGET', hash, unpack(pol.fields))
  local quotas, step, ARGV = pol.quotas, pol.step, ARGV
  local index = pol.index
  if index == nil then
    index = {}
    for i, f in ipairs(pol.fields) do index[f] = i end
    pol.index = index
  end
  -- Fields written by the generic path; with a step, every field once any
  -- request was admitted (the unchanged ones as they were read).
  local changed, stepped, ttl = {}, false, nil
  local now_arg, now, cost_arg, cost
  for i = first, last do
    -- Times and costs parsed only when they change (see run() below).
    local base = args + 4 * (i - 1)
    local t, c = ARGV[base + 2], ARGV[base + 3]
    if t ~= now_arg or t == '' then now_arg, now = t, read_now(t) end
    if c ~= cost_arg then cost_arg, cost = c, tonumber(c) end
    local units = tonumber(ARGV[base + 4])
    if step then
      -- A lone quota whose algorithm steps through a run on `vals` itself.
      local admitted, e = step(quotas[1], vals, now, cost, out)
      if admitted then
        stepped = true
        if e then ttl = e - now end
      end
    elseif decide(quotas, vals, now, cost, units, out) then
      local set, e = writes(quotas, now)
      for f = 1, #set, 2 do
        local pos = index[set[f]]
        vals[pos] = set[f + 1]
        changed[pos] = true
      end
      if e then ttl = e end
    end
  end
  local set = {}
  for pos = 1, #vals do
    if (stepped or changed[pos]) and vals[pos] then
      set[#set + 1] = pol.fields[pos]
      set[#set + 1] = vals[pos]
    end
  end
  if #set > 0 then redis.call('HSET', hash, unpack(set)) end
  if ttl then redis.call('PEXPIRE', hash, ttl) end
end

local policies = {}
local at = 2
for i = 1, tonumber(ARGV[1]) do
  local quotas, r
  quotas, at, r = parse_quotas(at, 6)
  -- Whether any quota keeps a sliding log (a key of its own per request).
  local logs = false
  for _, q in ipairs(quotas) do logs = logs or q.alg.log ~= nil end
  local fields = quota_fields(quotas)
  -- A policy that waits or keeps a penalty box reads more fields, and is
  -- charged by lua/refusal.lua, never through a step or a run.
  if r then refusal.fields(quotas, r, fields) end
  -- A lone quota with a step (every algorithm but the sliding log), and
  -- the field a charge alone may change (see fixed_window.step).
  -- (A quota in another unit than requests is asked differently: see `ask`.)
  local alg = not r and #quotas == 1 and quotas[1].m == 0 and quotas[1].alg.step and quotas[1].alg
  policies[i] = {quotas = quotas, fields = fields, logs = logs,
    step = alg and alg.step, q1 = quotas[1], refusal = r,
    count = alg and alg.count and fields[alg.count]}
end

-- One pcall for the whole batch, not one per request: when request j (or
-- the run j..last) fails, its partial reply is taken back, it alone gets the
-- error, and the loop resumes after it.
local count = tonumber(ARGV[at])
local out, errors = {}, {}
local j, k, mark, last = 1, 1, 0, 1
local function run()
  -- The previous request's policy, time and cost, parsed: the requests of a
  -- batch mostly share them, and tonumber (glibc's strtod) costs about 1,000
  -- instructions for a 13-digit time. ("" = Redis TIME, read per request as
  -- before.) Locals of run(), not of the chunk: upvalues cost an allocation
  -- each per call, which a call of one request would pay for nothing.
  local pol_arg, pol, now_arg, now, cost_arg, cost
  -- Locals: a global is a table lookup on each use.
  local KEYS, ARGV = KEYS, ARGV
  while j <= count do
    mark = #out
    last = j
    local base = at + 4 * (j - 1)
    local p = ARGV[base + 1]
    if p ~= pol_arg then pol_arg, pol = p, policies[tonumber(p)] end
    local hash = KEYS[k]
    k = k + 1
    if pol.logs then k = bind_logs(pol.quotas, k) end
    -- The requests right after it whose policy is "0" continue its run:
    -- the same key (not repeated in KEYS) and policy, never one with logs.
    while last < count and ARGV[at + 4 * last + 1] == '0' do
      last = last + 1
    end
    if last > j then
      charge_run(hash, pol, j, last, at, out)
    else
      local t, c = ARGV[base + 2], ARGV[base + 3]
      if t ~= now_arg or t == '' then now_arg, now = t, read_now(t) end
      if c ~= cost_arg then cost_arg, cost = c, tonumber(c) end
      local step = pol.step
      if step then
        -- A policy of one quota: its algorithm's step on the fields read,
        -- with no table per request (the common case). Two or three fields,
        -- passed one by one (cheaper than unpack).
        local f = pol.fields
        local f1, f2, f3 = f[1], f[2], f[3]
        local v = f3 and redis.call('HMGET', hash, f1, f2, f3)
          or redis.call('HMGET', hash, f1, f2)
        local admitted, expire = step(pol.q1, v, now, cost, out)
        if expire then
          if f3 then
            redis.call('HSET', hash, f1, v[1], f2, v[2], f3, v[3])
          else
            redis.call('HSET', hash, f1, v[1], f2, v[2])
          end
          redis.call('PEXPIRE', hash, expire - now)
        elseif admitted then
          -- Only the count changed: added as sent, without turning a Lua
          -- number back into a string (snprintf).
          redis.call('HINCRBY', hash, pol.count, c)
        end
      elseif pol.refusal then
        refusal.charge(hash, pol, now, cost, ARGV[base + 4], out, decide, writes)
      else
        charge_one(hash, pol.quotas, pol.fields, now, cost, tonumber(ARGV[base + 4]), out)
      end
    end
    j = last + 1
  end
end
while j <= count do
  local ok, err = pcall(run)
  if not ok then
    for i = #out, mark + 1, -1 do out[i] = nil end
    local message = type(err) == 'table' and tostring(err.err) or tostring(err)
    for _ = j, last do
      out[#out + 1] = -1
      errors[#errors + 1] = message
    end
    j = last + 1
  end
end
-- Packed in chunks: unpack() of a whole reply could pass Lua's limit on
-- arguments (a sliding log may return thousands of entries).
local packed = {}
for i = 1, #out, 256 do
  local n = math.min(256, #out - i + 1)
  packed[#packed + 1] = struct.pack('<' .. string.rep('i8', n), unpack(out, i, i + n - 1))
end
return {table.concat(packed), unpack(errors)}
