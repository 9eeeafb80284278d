-- Make a reservation's claims permanent, unless its TTL lapsed first.
-- ARGV[2] = JSON {"rkeys": {resv id: reservation key}, "resv": <reservation id>, "rkey": <its key>}
-- Returns {1, "ok"}, {0, "expired"}, {-1, key} or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
local claims = reservation_declared(req.rkey)
if claims == nil then
  return {-1, req.rkey}
end
req.rkeys[req.resv] = req.rkey  -- its own lapse is always judged here
expire_lapsed(req.rkeys)
local raw = redis.call('HGET', req.rkey, 'claims')
if not raw then
  return {0, 'expired'}
end
for _, c in ipairs(claims) do
  if redis.call('EXISTS', c[1]) == 1 then  -- a pod that ended before the commit has released its claim already
    redis.call('HSET', c[1], 'resv', '')
  end
end
redis.call('DEL', req.rkey)
redis.call('ZREM', RESERVATIONS, req.resv)
return {1, 'ok'}
