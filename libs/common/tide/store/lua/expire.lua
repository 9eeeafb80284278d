-- The reconciler's step: release lapsed reservations, then hand over (and forget) every expired id.
-- ARGV[2] = JSON {"rkeys": {resv id: reservation key}} (the lapsed ones the client found, keys in KEYS)
-- Returns {1, ids...}: the reservation ids that lapsed since the last call; or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
expire_lapsed(req.rkeys)
local expired = redis.call('LRANGE', EXPIRED, 0, -1)
redis.call('DEL', EXPIRED)
table.insert(expired, 1, 1)
return expired
