-- Make a reservation's claims permanent, unless its TTL lapsed first.
-- ARGV[1] = JSON {"keys": {...}, "resv": <reservation id>}
-- Returns {1, "ok"} or {0, "expired"}.
local req = cjson.decode(ARGV[1])
local k = req.keys
expire_lapsed(k)
local rkey = k.resv_prefix .. req.resv
local raw = redis.call('HGET', rkey, 'claims')
if not raw then
  return {0, 'expired'}
end
for _, ckey in ipairs(cjson.decode(raw)) do
  redis.call('HSET', ckey, 'resv', '')
end
redis.call('DEL', rkey)
redis.call('ZREM', k.reservations, req.resv)
return {1, 'ok'}
