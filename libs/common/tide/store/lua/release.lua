-- Release claims (idempotent: a missing claim is skipped).
-- ARGV[1] = JSON {"index": <claims index key>, "keys": [claim keys]}
-- Returns the number of claims released.
local req = cjson.decode(ARGV[1])
local released = 0
for _, key in ipairs(req.keys) do
  local raw = redis.call('HGET', key, 'items')
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
    released = released + 1
  end
  redis.call('SREM', req.index, key)
end
return released
