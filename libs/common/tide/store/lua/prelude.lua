-- Shared by every claim script (prepended by tide/store/claims.py).
-- KEY NAMES come in ARGV[1] (JSON "keys"), so tide/store/keys.py stays their only definition.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function release_claim(index, key)
  local raw = redis.call('HGET', key, 'items')
  local released = 0
  if raw then
    for _, it in ipairs(cjson.decode(raw)) do
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
  redis.call('SREM', index, key)
  return released
end

-- Release every reservation whose TTL has lapsed; note each in the expired list for the reconciler.
local function expire_lapsed(k)
  local lapsed = redis.call('ZRANGEBYSCORE', k.reservations, '-inf', now_ms())
  for _, resv in ipairs(lapsed) do
    local rkey = k.resv_prefix .. resv
    local raw = redis.call('HGET', rkey, 'claims')
    if raw then
      for _, ckey in ipairs(cjson.decode(raw)) do
        release_claim(k.index, ckey)
      end
    end
    redis.call('DEL', rkey)
    redis.call('ZREM', k.reservations, resv)
    redis.call('RPUSH', k.expired, resv)
  end
  return lapsed
end
