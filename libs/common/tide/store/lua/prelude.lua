-- Shared by every claim script (prepended by tide/store/claims.py).
-- Every key a script touches comes in KEYS (Redis Cluster: all of them carry the {tide} hash tag):
--   KEYS[1] claims index, KEYS[2] reservations zset, KEYS[3] expired-reservations list, KEYS[4] placer leader
--   lease; the rest are the claim, capacity, used and reservation keys this call may touch, which the client
--   read before the call (tide.store.claims). A key the script finds it needs but was not given is never
--   touched: a lapsed reservation is then left for a later call, anything else answers {-1, key} (the client
--   reads again and retries).
-- ARGV[1] = the placer's lease token ('' = not fenced), ARGV[2] = the JSON request.
-- With a token, the script refuses ({-2, 'fenced'}) unless the leader lease holds exactly that token, so a
-- placer that lost its lease (paused, partitioned) writes nothing after another one took over.
local INDEX, RESERVATIONS, EXPIRED, LEADER = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local declared = {}
for _, key in ipairs(KEYS) do
  declared[key] = true
end

local function fenced()
  return ARGV[1] ~= '' and redis.call('GET', LEADER) ~= ARGV[1]
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The keys releasing a claim touches: its used keys (from its stored items). nil when the claim or one of
-- them was not declared; {} for a claim that does not exist.
local function claim_keys_declared(key)
  if not declared[key] then
    return nil
  end
  local raw = redis.call('HGET', key, 'items')
  if not raw then
    return {}
  end
  local items = cjson.decode(raw)
  for _, it in ipairs(items) do
    if not declared[it[2]] then
      return nil
    end
  end
  return items
end

-- The claims ``keys`` with their items ({{key, items}, ...}, for release_items), or nil and the first key (a
-- claim's or one of its used keys') that was not declared.
local function claims_declared(keys)
  local checked = {}
  for _, key in ipairs(keys) do
    local items = claim_keys_declared(key)
    if items == nil then
      return nil, key
    end
    table.insert(checked, {key, items})
  end
  return checked
end

-- Release one claim whose keys were checked by claim_keys_declared (items: what it returned).
local function release_items(key, items)
  local released = 0
  if redis.call('EXISTS', key) == 1 then
    for _, it in ipairs(items) do
      local amount = tonumber(it[4])
      if amount ~= 0 then
        local left = redis.call('HINCRBY', it[2], it[3], -amount)
        if left < 0 then
          redis.call('HSET', it[2], it[3], 0)
        end
      end
    end
    redis.call('DEL', key)
    released = 1
  end
  redis.call('SREM', INDEX, key)
  return released
end

-- A reservation's claim keys with their items, or nil when any key it touches was not declared.
local function reservation_declared(rkey)
  if not declared[rkey] then
    return nil
  end
  local raw = redis.call('HGET', rkey, 'claims')
  local out = {}
  if raw then
    for _, ckey in ipairs(cjson.decode(raw)) do
      local items = claim_keys_declared(ckey)
      if items == nil then
        return nil
      end
      table.insert(out, {ckey, items})
    end
  end
  return out
end

-- Release every lapsed reservation whose keys were declared; note each in the expired list for the
-- reconciler. ``rkeys``: reservation id -> its hash key, as the client named them.
local function expire_lapsed(rkeys)
  local lapsed = redis.call('ZRANGEBYSCORE', RESERVATIONS, '-inf', now_ms())
  for _, resv in ipairs(lapsed) do
    local rkey = rkeys[resv]
    local claims = rkey and reservation_declared(rkey)
    if claims then
      for _, c in ipairs(claims) do
        release_items(c[1], c[2])
      end
      redis.call('DEL', rkey)
      redis.call('ZREM', RESERVATIONS, resv)
      redis.call('RPUSH', EXPIRED, resv)
    end
  end
end

-- The first key a gang's claim request names that was not declared, or nil. ``g``: {resv, rkey, ttl_ms,
-- claims = [{key, alloc, items = [[cap_key, used_key, field, amount], ...]}]}.
local function undeclared_gang_key(g)
  for _, c in ipairs(g.claims) do
    if not declared[c.key] then
      return c.key
    end
    for _, it in ipairs(c.items) do
      if not (declared[it[1]] and declared[it[2]]) then
        return it[1] .. ' ' .. it[2]
      end
    end
  end
  if g.resv ~= '' and not declared[g.rkey] then
    return g.rkey
  end
  return nil
end

-- Claim every slot of one gang (its keys checked by undeclared_gang_key): all or nothing. Returns 1, 'ok' or
-- 0 and why nothing was claimed. With a reservation the claims lapse after ttl_ms unless commit runs first.
local function claim_gang(g)
  local need = {}
  local order = {}
  for _, c in ipairs(g.claims) do
    if redis.call('EXISTS', c.key) == 1 then
      return 0, 'already claimed: ' .. c.key
    end
    for _, it in ipairs(c.items) do
      local id = it[1] .. '\0' .. it[3]
      if need[id] == nil then
        need[id] = {cap = it[1], used = it[2], field = it[3], amount = 0}
        table.insert(order, id)
      end
      need[id].amount = need[id].amount + tonumber(it[4])
    end
  end
  for _, id in ipairs(order) do
    local n = need[id]
    local cap = tonumber(redis.call('HGET', n.cap, n.field))
    if cap == nil then
      return 0, 'unknown resource ' .. n.cap .. ' ' .. n.field
    end
    local used = tonumber(redis.call('HGET', n.used, n.field) or '0')
    if used + n.amount > cap then
      return 0, 'insufficient ' .. n.field .. ' on ' .. n.cap .. ': ' .. used .. '+' .. n.amount .. '>' .. cap
    end
  end
  for _, id in ipairs(order) do
    local n = need[id]
    if n.amount ~= 0 then
      redis.call('HINCRBY', n.used, n.field, n.amount)
    end
  end
  local keys = {}
  for _, c in ipairs(g.claims) do
    redis.call('HSET', c.key, 'items', cjson.encode(c.items), 'alloc', c.alloc, 'resv', g.resv)
    redis.call('SADD', INDEX, c.key)
    table.insert(keys, c.key)
  end
  if g.resv ~= '' then
    local expires = now_ms() + tonumber(g.ttl_ms)
    redis.call('HSET', g.rkey, 'claims', cjson.encode(keys), 'expires_ms', expires)
    redis.call('ZADD', RESERVATIONS, expires, g.resv)
  end
  return 1, 'ok'
end
