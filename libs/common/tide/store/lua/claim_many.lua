-- Claim the slots of several gangs in one step, each gang all or nothing on its own, in order (a gang sees what
-- the gangs before it claimed): claim.lua for a list, as if each gang had been claimed alone, one after the other.
-- ARGV[2] = JSON {"rkeys": {resv id: reservation key},
--                 "gangs": [{"resv": <reservation id or "">, "rkey": <its key>, "ttl_ms": <ms, with resv>,
--                            "claims": [{"key": <claim key>, "alloc": <json string>,
--                                        "items": [[cap_key, used_key, field, amount], ...]}]}, ...]}
-- (every key named here is also in KEYS). Returns {1, {code, reason, code, reason, ...}} (per gang, in order:
-- 1 "ok" or 0 and why nothing of it was claimed), {-1, key} or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
for _, g in ipairs(req.gangs) do
  for _, c in ipairs(g.claims) do
    if not declared[c.key] then
      return {-1, c.key}
    end
    for _, it in ipairs(c.items) do
      if not (declared[it[1]] and declared[it[2]]) then
        return {-1, it[1] .. ' ' .. it[2]}
      end
    end
  end
  if g.resv ~= '' and not declared[g.rkey] then
    return {-1, g.rkey}
  end
end
expire_lapsed(req.rkeys)

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

local out = {}
for _, g in ipairs(req.gangs) do
  local code, reason = claim_gang(g)
  table.insert(out, code)
  table.insert(out, reason)
end
return {1, out}
