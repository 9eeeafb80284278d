-- The reconciler's step: release lapsed reservations, then hand over (and forget) every expired id.
-- ARGV[1] = JSON {"keys": {...}}
-- Returns the reservation ids that lapsed since the last call.
local req = cjson.decode(ARGV[1])
local k = req.keys
expire_lapsed(k)
local expired = redis.call('LRANGE', k.expired, 0, -1)
redis.call('DEL', k.expired)
return expired
