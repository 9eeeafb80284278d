-- Release claims (idempotent: a missing claim is skipped), and optionally a whole reservation.
-- ARGV[1] = JSON {"keys": {...}, "claims": [claim keys], "resv": <reservation id or "">}
-- Returns the number of claims released.
local req = cjson.decode(ARGV[1])
local k = req.keys
local released = 0
for _, key in ipairs(req.claims) do
  released = released + release_claim(k.index, key)
end
if req.resv ~= '' then
  redis.call('DEL', k.resv_prefix .. req.resv)
  redis.call('ZREM', k.reservations, req.resv)
end
return released
